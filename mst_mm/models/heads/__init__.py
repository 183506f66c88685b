from .decoder_head import ImageDecoderHead
from .dino_head import DINOHead

__all__ = ['DINOHead', 'ImageDecoderHead']
