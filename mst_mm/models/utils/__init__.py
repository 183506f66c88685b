from .attention_mask import MASK_MODES, attention_mask, check_mask_args

__all__ = ['MASK_MODES', 'attention_mask', 'check_mask_args']
