"""DINO / BYOL multi-crop, composed from mmpretrain's own transforms."""
import copy
from typing import Sequence, Tuple

from mmcv.transforms import BaseTransform
from mmengine.registry import DefaultScope
from mmpretrain.registry import TRANSFORMS


def _colour_distortion() -> list:
    return [
        dict(type='RandomFlip', prob=0.5),
        dict(type='RandomApply', prob=0.8, transforms=[
            dict(type='ColorJitter', brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)]),
        dict(type='RandomGrayscale', prob=0.2, keep_channels=True,
             channel_weights=(0.114, 0.587, 0.2989)),
    ]


def _blur(prob: float) -> dict:
    # magnitude_std='inf' draws the radius uniformly from the range at every call.
    return dict(type='GaussianBlur', magnitude_range=(0.1, 2.0), magnitude_std='inf', prob=prob)


@TRANSFORMS.register_module()
class MultiCrop(BaseTransform):
    """Two global views and ``num_local_crops`` local views of one decoded image.

    The views follow BYOL's asymmetric recipe (paper appendix "Data augmentation"): flip,
    colour jitter (p=0.8), grayscale (p=0.2) everywhere; blur with p=1.0 on the first global
    view, p=0.1 plus solarisation (p=0.2) on the second, p=0.5 on local views. It expands to
    mmpretrain's ``MultiView`` of ``RandomResizedCrop``, ``ColorJitter``, ``GaussianBlur``,
    ``Solarize``, ...; every random parameter is drawn per view and per sample.

    Args:
        global_size (int): Global crop size. Defaults to 224.
        local_size (int): Local crop size. Defaults to 96.
        num_local_crops (int): Defaults to 8.
        global_scale (tuple): Area range of global crops. Defaults to (0.4, 1.0).
        local_scale (tuple): Area range of local crops. Defaults to (0.05, 0.4).
        interpolation (str): Resize interpolation. Defaults to 'bicubic'.
        backend (str): Resize backend. Defaults to 'pillow'.
    """

    def __init__(self,
                 global_size: int = 224,
                 local_size: int = 96,
                 num_local_crops: int = 8,
                 global_scale: Sequence[float] = (0.4, 1.0),
                 local_scale: Sequence[float] = (0.05, 0.4),
                 interpolation: str = 'bicubic',
                 backend: str = 'pillow') -> None:
        if local_size > global_size:
            raise ValueError(f'Local crops ({local_size} px) must not be larger than global '
                             f'crops ({global_size} px): swap them or shrink local_size.')
        if num_local_crops < 0:
            raise ValueError(f'num_local_crops must be >= 0, got {num_local_crops}.')
        self.num_local_crops = num_local_crops

        def crop(size: int, scale: Tuple[float, float]) -> dict:
            return dict(type='RandomResizedCrop', scale=size, crop_ratio_range=tuple(scale),
                        interpolation=interpolation, backend=backend)

        global_1 = [crop(global_size, global_scale), *_colour_distortion(), _blur(1.0)]
        global_2 = [crop(global_size, global_scale), *_colour_distortion(), _blur(0.1),
                    dict(type='Solarize', thr=128, prob=0.2)]
        local = [crop(local_size, local_scale), *_colour_distortion(), _blur(0.5)]
        views, pipelines = [1, 1], [global_1, global_2]
        if num_local_crops:
            views.append(num_local_crops)
            pipelines.append(local)
        # The nested transforms resolve in mmpretrain's scope even outside a runner.
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            self.multi_view = TRANSFORMS.build(
                dict(type='MultiView', num_views=views, transforms=copy.deepcopy(pipelines)))

    def transform(self, results: dict) -> dict:
        return self.multi_view(results)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.multi_view!r})'
