from .checked_dataset import (
    OWN_DATA_HINT,
    CheckedImageDataset,
    LoadImageOrSkip,
    image_problem,
)
from .folder_scan import IgnoredEntries, scan_image_folder, why_not_a_file
from .image_folder import LAYOUTS, PretrainImageFolder, describe_layouts, detect_layout
from .image_format import format_from_extension, sniff_image_format, undecodable_reason
from .transforms import ContiguousRandomResizedCrop, FusedColorJitter, MultiCrop
from .worker_init import worker_init_from_torch_seed

__all__ = [
    'CheckedImageDataset', 'ContiguousRandomResizedCrop',
    'FusedColorJitter', 'IgnoredEntries', 'LAYOUTS', 'LoadImageOrSkip', 'MultiCrop',
    'OWN_DATA_HINT', 'PretrainImageFolder', 'describe_layouts', 'detect_layout',
    'format_from_extension', 'image_problem', 'scan_image_folder', 'sniff_image_format',
    'undecodable_reason', 'why_not_a_file', 'worker_init_from_torch_seed'
]
