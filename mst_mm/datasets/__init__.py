from .image_folder import CheckedImageDataset, PretrainImageFolder, detect_layout
from .transforms import FusedColorJitter, LoadImageOrSkip, MultiCrop

__all__ = [
    'CheckedImageDataset', 'FusedColorJitter',
    'LoadImageOrSkip', 'MultiCrop', 'PretrainImageFolder', 'detect_layout'
]
