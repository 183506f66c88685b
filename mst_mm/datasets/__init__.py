from .demo_textures import SOURCES as DEMO_TEXTURES
from .demo_textures import stratified_split, texture_patches, write_demo_dataset
from .transforms import ContiguousRandomResizedCrop, FusedColorJitter, MultiCrop

__all__ = ['DEMO_TEXTURES', 'ContiguousRandomResizedCrop', 'FusedColorJitter', 'MultiCrop',
           'stratified_split', 'texture_patches', 'write_demo_dataset']
