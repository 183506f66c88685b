from .dino_neck import DINONeck, frozen_bn_statistics
from .multi_block_neck import MultiBlockCLSNeck

__all__ = ['DINONeck', 'MultiBlockCLSNeck', 'frozen_bn_statistics']
