from .transforms import MultiCrop

__all__ = ['MultiCrop']
