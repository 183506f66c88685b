from .checked_dataset import CheckedImageDataset, LoadImageOrSkip
from .image_folder import PretrainImageFolder, detect_layout
from .transforms import ContiguousRandomResizedCrop, FusedColorJitter, MultiCrop
from .worker_init import worker_init_from_torch_seed

__all__ = [
    'CheckedImageDataset', 'ContiguousRandomResizedCrop', 'FusedColorJitter',
    'LoadImageOrSkip', 'MultiCrop', 'PretrainImageFolder', 'detect_layout',
    'worker_init_from_torch_seed'
]
