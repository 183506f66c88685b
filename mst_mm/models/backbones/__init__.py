from .mask_vit import MaskViT, MSTFeatures, encoder_layer_with_cls_attention

__all__ = ['MaskViT', 'MSTFeatures', 'encoder_layer_with_cls_attention']
