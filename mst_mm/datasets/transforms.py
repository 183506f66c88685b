"""DINO / BYOL multi-crop, composed from mmpretrain's own transforms."""
import copy
from typing import Sequence, Tuple

import mmcv
import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import DefaultScope
from mmpretrain.datasets.transforms import ColorJitter, RandomResizedCrop
from mmpretrain.registry import TRANSFORMS
from PIL import Image, ImageEnhance

from ..models.utils.batch_multicrop import check_crop_sizes


@TRANSFORMS.register_module()
class FusedColorJitter(ColorJitter):
    """mmpretrain's ``ColorJitter``, bit for bit, with one PIL round trip instead of four
    (mmcv's pillow ops each convert to PIL and back). Other backends and non-RGB inputs fall
    back to the parent. See docs/benchmarks.md."""

    def transform(self, results: dict) -> dict:
        img = results['img']
        if (self.backend != 'pillow' or img.dtype != np.uint8 or img.ndim != 3
                or img.shape[2] != 3):
            return super().transform(results)
        order, brightness, contrast, saturation, hue = self._rand_params()
        pil_image = Image.fromarray(np.ascontiguousarray(img[..., ::-1]))
        for index in order:
            if index == 0 and brightness is not None:
                pil_image = ImageEnhance.Brightness(pil_image).enhance(brightness)
            elif index == 1 and contrast is not None:
                pil_image = ImageEnhance.Contrast(pil_image).enhance(contrast)
            elif index == 2 and saturation is not None:
                pil_image = ImageEnhance.Color(pil_image).enhance(saturation)
            elif index == 3 and hue is not None:
                pil_image = _shift_hue(pil_image, hue)
        results['img'] = np.array(pil_image)[..., ::-1]
        return results


@TRANSFORMS.register_module()
class ContiguousRandomResizedCrop(RandomResizedCrop):
    """mmpretrain's ``RandomResizedCrop``, bit for bit, without PIL's slow copy of a strided
    crop view. See docs/benchmarks.md."""

    def transform(self, results: dict) -> dict:
        img = results['img']
        offset_h, offset_w, target_h, target_w = self.rand_crop_params(img)
        img = np.ascontiguousarray(img[offset_h:offset_h + target_h,
                                       offset_w:offset_w + target_w])
        img = mmcv.imresize(img, tuple(self.scale[::-1]), interpolation=self.interpolation,
                            backend=self.backend)
        results['img'] = img
        results['img_shape'] = img.shape
        return results


def _shift_hue(pil_image: Image.Image, hue_factor: float) -> Image.Image:
    """mmcv's pillow ``adjust_hue`` on a PIL RGB image: rotate H in HSV, uint8 wrap-around."""
    h, s, v = pil_image.convert('HSV').split()
    np_h = np.array(h, dtype=np.uint8)
    with np.errstate(over='ignore'):
        np_h += np.uint8(hue_factor * 255)
    return Image.merge('HSV', (Image.fromarray(np_h, 'L'), s, v)).convert('RGB')


def _colour_distortion(jitter: str) -> list:
    return [
        dict(type='RandomFlip', prob=0.5),
        dict(type='RandomApply', prob=0.8, transforms=[
            dict(type=jitter, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)]),
        dict(type='RandomGrayscale', prob=0.2, keep_channels=True,
             channel_weights=(0.114, 0.587, 0.2989)),
    ]


def _blur(prob: float, radius: Tuple[float, float]) -> dict:
    # magnitude_std='inf' draws the radius uniformly from the range at every call.
    return dict(type='GaussianBlur', magnitude_range=tuple(radius), magnitude_std='inf',
                prob=prob)


@TRANSFORMS.register_module()
class MultiCrop(BaseTransform):
    """Two global views and ``num_local_crops`` local views of one decoded image, with
    BYOL's asymmetric augmentations (docs/method.md), as mmpretrain's ``MultiView``.

    Args:
        global_size (int): Global crop size. Defaults to 224.
        local_size (int): Local crop size. Defaults to 96.
        num_local_crops (int): Defaults to 8.
        global_scale (tuple): Area range of global crops. Defaults to (0.4, 1.0).
        local_scale (tuple): Area range of local crops. Defaults to (0.05, 0.4).
        interpolation (str): Resize interpolation. Defaults to 'bicubic'.
        backend (str): Resize backend. Defaults to 'pillow'.
        blur_radius (tuple): Blur radius range in crop pixels; DINO's (0.1, 2.0) suits
            224-px crops, scale it down for small ones. Defaults to (0.1, 2.0).
        fast_transforms (bool): Use the bit-identical faster crop and jitter above.
            Defaults to True.
    """

    def __init__(self,
                 global_size: int = 224,
                 local_size: int = 96,
                 num_local_crops: int = 8,
                 global_scale: Sequence[float] = (0.4, 1.0),
                 local_scale: Sequence[float] = (0.05, 0.4),
                 interpolation: str = 'bicubic',
                 backend: str = 'pillow',
                 blur_radius: Sequence[float] = (0.1, 2.0),
                 fast_transforms: bool = True) -> None:
        check_crop_sizes(global_size, local_size, num_local_crops)
        self.num_local_crops = num_local_crops
        crop_type = 'ContiguousRandomResizedCrop' if fast_transforms else 'RandomResizedCrop'
        jitter = 'FusedColorJitter' if fast_transforms else 'ColorJitter'

        def crop(size: int, scale: Tuple[float, float]) -> dict:
            return dict(type=crop_type, scale=size, crop_ratio_range=tuple(scale),
                        interpolation=interpolation, backend=backend)

        global_1 = [crop(global_size, global_scale), *_colour_distortion(jitter),
                    _blur(1.0, blur_radius)]
        global_2 = [crop(global_size, global_scale), *_colour_distortion(jitter),
                    _blur(0.1, blur_radius),
                    dict(type='Solarize', thr=128, prob=0.2)]
        local = [crop(local_size, local_scale), *_colour_distortion(jitter),
                 _blur(0.5, blur_radius)]
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
