from .attention_mask import MASK_MODES, attention_mask, check_mask_args
from .batch_multicrop import BatchMultiCrop, MultiCropDataPreprocessor
from .fused_ema import FusedCosineEMA

__all__ = ['MASK_MODES', 'BatchMultiCrop', 'FusedCosineEMA', 'MultiCropDataPreprocessor',
           'attention_mask', 'check_mask_args']
