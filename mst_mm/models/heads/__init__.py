from .decoder_head import ImageDecoderHead
from .dino_head import DINODistillHead

__all__ = ['DINODistillHead', 'ImageDecoderHead']
