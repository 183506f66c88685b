from .attention_mask import MASK_MODES, attention_mask, check_mask_args
from .fused_ema import FusedCosineEMA

__all__ = ['MASK_MODES', 'FusedCosineEMA', 'attention_mask', 'check_mask_args']
