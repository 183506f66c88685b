from .image_folder import CheckedImageDataset, PretrainImageFolder, detect_layout
from .transforms import ContiguousRandomResizedCrop, FusedColorJitter, LoadImageOrSkip, MultiCrop

__all__ = [
    'CheckedImageDataset', 'ContiguousRandomResizedCrop', 'FusedColorJitter',
    'LoadImageOrSkip', 'MultiCrop', 'PretrainImageFolder', 'detect_layout'
]
