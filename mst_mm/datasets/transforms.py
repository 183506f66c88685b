"""Image loading that skips broken images, and DINO multi-crop from mmpretrain's transforms."""
import copy
import logging
from typing import Optional, Sequence, Tuple

import mmcv
import numpy as np
from mmcv.transforms import BaseTransform, LoadImageFromFile
from mmengine.logging import print_log
from mmengine.registry import DefaultScope
from mmpretrain.datasets.transforms import ColorJitter
from mmpretrain.registry import TRANSFORMS
from PIL import Image, ImageEnhance

from ..models.utils.batch_multicrop import check_crop_sizes


@TRANSFORMS.register_module()
class LoadImageOrSkip(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` that warns and returns None for an image it cannot read or
    decode; the dataset then draws another and counts it (``max_corrupt_images``)."""

    def transform(self, results: dict) -> Optional[dict]:
        try:
            return super().transform(results)
        except OSError as error:  # missing, no permission, I/O error
            reason = f'cannot read it ({error})'
        except Exception:  # the decoder raised, or returned None (mmcv then asserts)
            reason = 'cannot decode it'
        print_log(f'Skipping {results["img_path"]}: {reason}.', logger='current',
                  level=logging.WARNING)
        return None


NUMPY2_HUE = ("mmpretrain's ColorJitter shifts the hue with mmcv's adjust_hue, which raises "
              'OverflowError for a negative hue under numpy 2 (numpy {version} is installed)')


def _numpy2() -> bool:
    return int(np.__version__.split('.')[0]) >= 2


@TRANSFORMS.register_module()
class FusedColorJitter(ColorJitter):
    """mmpretrain's ``ColorJitter``, bit for bit, with one PIL round trip instead of mmcv's four;
    other backends and non-RGB inputs fall back to the parent. See docs/benchmarks.md."""

    def transform(self, results: dict) -> dict:
        img = results['img']
        if (self.backend != 'pillow' or img.dtype != np.uint8 or img.ndim != 3
                or img.shape[2] != 3):
            try:
                return super().transform(results)
            except OverflowError as error:
                if not _numpy2():
                    raise
                raise RuntimeError(
                    NUMPY2_HUE.format(version=np.__version__) + f': this image ({img.dtype}, '
                    f'shape {img.shape}, backend {self.backend!r}) is not the 8-bit RGB that '
                    "mst_mm's own hue shift takes. Convert the images to 8-bit RGB, use the "
                    "pillow backend, or install 'numpy<2'.") from error
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


def _shift_hue(pil_image: Image.Image, hue_factor: float) -> Image.Image:
    """mmcv's pillow ``adjust_hue`` on a PIL RGB image: rotate H in HSV, uint8 wrap-around."""
    h, s, v = pil_image.convert('HSV').split()
    np_h = np.array(h, dtype=np.uint8)
    # mmcv's np.uint8(hue_factor * 255) truncates toward zero and wraps modulo 256 under numpy 1
    # and raises OverflowError for a negative factor under numpy 2: the same steps, in Python.
    np_h += np.uint8(int(hue_factor * 255) % 256)
    return Image.merge('HSV', (Image.fromarray(np_h, 'L'), s, v)).convert('RGB')


@TRANSFORMS.register_module()
class MultiCrop(BaseTransform):
    """Two global views and ``num_local_crops`` local views of one decoded image, with BYOL's
    asymmetric augmentations (docs/method.md), as mmpretrain's ``MultiView``. ``*_scale`` are
    area ranges; ``blur_radius`` is in crop pixels (DINO's (0.1, 2.0) suits 224-px crops, scale
    it down for small ones); ``fast_transforms`` uses the bit-identical jitter above, whose hue
    shift also works under numpy 2.

    ``crops_only=True`` stops after each view's crop and resize, the part that needs the
    decoded image of its own size: ``BatchViewAugment`` in ``MultiCropDataPreprocessor``
    then applies the rest to the whole batch on the model's device, with the same
    parameters and ranges (the GPU recipe; ``blur_radius`` is then the preprocessor's)."""

    def __init__(self, global_size: int = 224, local_size: int = 96, num_local_crops: int = 8,
                 global_scale: Sequence[float] = (0.4, 1.0),
                 local_scale: Sequence[float] = (0.05, 0.4), interpolation: str = 'bicubic',
                 backend: str = 'pillow', blur_radius: Sequence[float] = (0.1, 2.0),
                 fast_transforms: bool = True, crops_only: bool = False) -> None:
        check_crop_sizes(global_size, local_size, num_local_crops)
        if not fast_transforms and _numpy2():
            raise ValueError(NUMPY2_HUE.format(version=np.__version__) + ': '
                             'MultiCrop(fast_transforms=False) uses it. Use '
                             'fast_transforms=True (the same images, bit for bit, with '
                             "mst_mm's own hue shift), or install 'numpy<2'.")
        self.num_local_crops = num_local_crops
        self.crops_only = crops_only and backend == 'pillow'
        jitter = 'FusedColorJitter' if fast_transforms else 'ColorJitter'

        def view(size: int, scale: Tuple[float, float], blur_prob: float, *tail: dict) -> list:
            crop = dict(type='RandomResizedCrop', scale=size, crop_ratio_range=tuple(scale),
                        interpolation=interpolation, backend=backend)
            if crops_only:
                return [crop]
            # magnitude_std='inf' draws the blur radius uniformly from the range at every call.
            return [crop,
                    dict(type='RandomFlip', prob=0.5),
                    dict(type='RandomApply', prob=0.8, transforms=[dict(
                        type=jitter, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)]),
                    dict(type='RandomGrayscale', prob=0.2, keep_channels=True,
                         channel_weights=(0.114, 0.587, 0.2989)),
                    dict(type='GaussianBlur', magnitude_range=tuple(blur_radius),
                         magnitude_std='inf', prob=blur_prob), *tail]

        pipelines = [view(global_size, global_scale, 1.0),
                     view(global_size, global_scale, 0.1, dict(type='Solarize', thr=128, prob=0.2)),
                     view(local_size, local_scale, 0.5)]
        kept = 3 if num_local_crops else 2  # no local pipeline without local crops
        # The nested transforms resolve in mmpretrain's scope even outside a runner.
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            self.multi_view = TRANSFORMS.build(dict(
                type='MultiView', num_views=[1, 1, num_local_crops][:kept],
                transforms=copy.deepcopy(pipelines[:kept])))

    def transform(self, results: dict) -> dict:
        return self._crops(results) if self.crops_only else self.multi_view(results)

    def _crops(self, results: dict) -> dict:
        """The views' crops from one PIL image, bit for bit what ``multi_view`` gives with
        ``crops_only`` and the same random state; ``MultiView`` would copy the whole decoded
        image once per view, and each crop would be converted to PIL on its own."""
        img = results['img']
        image = Image.fromarray(np.ascontiguousarray(img))
        views = []
        for pipeline, copies in zip(self.multi_view.pipelines, self.multi_view.num_views):
            crop = pipeline.transforms[0]
            size = tuple(crop.scale[::-1])
            for _ in range(copies):
                top, left, height, width = crop.rand_crop_params(img)
                box = (left, top, left + width, top + height)
                views.append(np.array(image.crop(box).resize(
                    size, mmcv.image.geometric.pillow_interp_codes[crop.interpolation])))
        results.update(img=views, img_shape=[view.shape[:2] for view in views])
        return results

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.multi_view!r}, crops_only={self.crops_only})'
