from .dino_neck import DINONeck, frozen_bn_statistics

__all__ = ['DINONeck', 'frozen_bn_statistics']
