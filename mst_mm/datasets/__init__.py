from .checked_dataset import CheckedImageDataset, CheckedImageNet, LoadImageOrSkip, image_problem
from .demo_textures import SOURCES as DEMO_TEXTURES
from .demo_textures import stratified_split, texture_patches, write_demo_dataset
from .transforms import ContiguousRandomResizedCrop, FusedColorJitter, MultiCrop
from .worker_init import worker_init_from_torch_seed

__all__ = [
    'CheckedImageDataset', 'CheckedImageNet', 'ContiguousRandomResizedCrop', 'DEMO_TEXTURES',
    'FusedColorJitter', 'LoadImageOrSkip', 'MultiCrop', 'image_problem', 'stratified_split',
    'texture_patches', 'worker_init_from_torch_seed', 'write_demo_dataset'
]
