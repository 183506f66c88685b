from .mask_swin import MaskSwin, pooled_query_attention, pooled_similarity, upsample_mask
from .mask_vit import MaskViT, MSTFeatures, encoder_layer_with_cls_attention

__all__ = [
    'MaskViT', 'MSTFeatures', 'encoder_layer_with_cls_attention', 'MaskSwin',
    'pooled_query_attention', 'pooled_similarity', 'upsample_mask'
]
