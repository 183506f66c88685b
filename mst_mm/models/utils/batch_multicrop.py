"""DINO's multi-crop augmentations for a whole batch, as a few tensor operations on the
training device.

``MultiCrop`` (``mst_mm/datasets/transforms.py``) makes the views image by image in the data
workers, a dozen PIL and numpy calls per view. Two batched transforms take over part of that
work inside :class:`MultiCropDataPreprocessor`, drawing the same parameters from the same
ranges, per view:

- :class:`BatchViewAugment`: flip, colour jitter, grey, blur and solarisation of views that
  the workers have only cut and resized (``MultiCrop(crops_only=True)``): the 224-px
  pipeline, whose images differ in size.
- :class:`BatchMultiCrop`: the crops too, for data sets whose images share one size (the
  32-px evidence images, where PIL's per-call cost, not the pixels, dominates).

What differs from the per-image pipeline is the arithmetic, not the distribution: float
operations rounded to the uint8 grid after each step, where PIL works in fixed point
(docs/benchmarks.md). Every random draw is made on the images' device and no value is read
back to the host, so on a GPU the preprocessor queues its work without waiting.
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
from mmpretrain.models import SelfSupDataPreprocessor
from mmpretrain.registry import MODELS, TRANSFORMS

from .precision import float32_region
from .view_ops import (
    blur_weights,
    colour_jitter,
    flip,
    grayscale,
    per_view,
    resize_weights,
    solarize,
    to_uint8_grid,
)


def check_crop_sizes(global_size: int, local_size: int, num_local_crops: int) -> None:
    """Refuse crop settings that cannot make DINO's views, naming the fix."""
    if local_size > global_size:
        raise ValueError(f'Local crops ({local_size} px) must not be larger than global '
                         f'crops ({global_size} px): swap them or shrink local_size.')
    if num_local_crops < 0:
        raise ValueError(f'num_local_crops must be >= 0, got {num_local_crops}.')


@TRANSFORMS.register_module()
class BatchViewAugment:
    """The augmentations of ``MultiCrop`` after the crop, for views that the data workers
    have cut and resized (``MultiCrop(crops_only=True)``), per view with ``MultiCrop``'s
    parameters and ranges: horizontal flip (0.5), colour jitter (0.8; brightness and
    contrast 0.4, saturation 0.2, hue 0.1, in random order), grayscale (0.2), Gaussian blur
    (1.0, 0.1 and 0.5 for the first global, the second global and the local views) and
    solarisation (0.2, second global view). The random draws come from torch's generator
    of the images' device, so ``randomness=dict(seed=...)`` fixes them.

    Args:
        num_global_crops (int): The leading global views; ``MultiCrop`` makes 2.
        blur_radius (Sequence[float]): The blur's standard deviation range in view pixels,
            ``MultiCrop``'s ``blur_radius``.
    """

    def __init__(self, num_global_crops: int = 2,
                 blur_radius: Sequence[float] = (0.1, 2.0)) -> None:
        if num_global_crops != 2:
            raise ValueError('BatchViewAugment follows MultiCrop, which makes exactly 2 '
                             f'global views (blur 1.0 and 0.1); got num_global_crops='
                             f'{num_global_crops}.')
        self.num_global_crops = num_global_crops
        self.blur_radius = tuple(blur_radius)

    def __call__(self, views: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Augment (B, 3, h, w) views with values in [0, 255], global views first; views of
        one size are augmented together. Returns them in the same order, as float."""
        if isinstance(views, torch.Tensor) or len(views) < self.num_global_crops:
            raise ValueError(
                f'BatchViewAugment takes the list of views that MultiCrop(crops_only=True) '
                f'makes in the data workers (at least {self.num_global_crops}), got '
                f'{_describe(views)}. Put MultiCrop(crops_only=True) in the dataset pipeline, '
                'or use BatchMultiCrop for images of one size.')
        globals_, locals_ = views[:self.num_global_crops], views[self.num_global_crops:]
        out = self.augment(globals_, (1.0, 0.1), (0.0, 0.2))
        if locals_:
            out += self.augment(locals_, (0.5, ) * len(locals_), (0.0, ) * len(locals_))
        return out

    def augment(self, views: Sequence[torch.Tensor], blur_probs: Sequence[float],
                solarize_probs: Sequence[float]) -> List[torch.Tensor]:
        """Flip, jitter, grey, blur and solarise same-size ``views`` as one batch, view
        ``v`` blurred with probability ``blur_probs[v]`` and solarised with
        ``solarize_probs[v]``."""
        x = torch.cat([v.float() for v in views])
        batch, device = views[0].shape[0], x.device
        return list(self._augment(x, per_view(blur_probs, batch, device),
                                  per_view(solarize_probs, batch, device),
                                  any(solarize_probs)).chunk(len(views)))

    def _augment(self, x: torch.Tensor, blur_prob: torch.Tensor, solarize_prob: torch.Tensor,
                 may_solarize: bool) -> torch.Tensor:
        n, device = x.shape[0], x.device
        x = flip(x, torch.rand(n, device=device) < 0.5)

        jittered = torch.rand(n, device=device) < 0.8
        order = torch.rand(n, 4, device=device).argsort(1)
        factors = torch.stack([torch.empty(n, device=device).uniform_(0.6, 1.4),
                               torch.empty(n, device=device).uniform_(0.6, 1.4),
                               torch.empty(n, device=device).uniform_(0.8, 1.2),
                               torch.empty(n, device=device).uniform_(-0.1, 0.1)], 1)
        x = colour_jitter(x, jittered, order, factors.to(x))

        x = grayscale(x, torch.rand(n, device=device) < 0.2)

        # Unblurred views get sigma 0, an identity matrix: the product leaves them exact.
        blurred = torch.rand(n, device=device) < blur_prob
        sigma = torch.empty(n, device=device).uniform_(*self.blur_radius) * blurred
        kernel = blur_weights(sigma, x.shape[-1], self.blur_radius[1]).to(x)
        x = to_uint8_grid(kernel[:, None] @ x @ kernel[:, None].transpose(-1, -2))

        if may_solarize:
            x = solarize(x, torch.rand(n, device=device) < solarize_prob)
        return x

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_global_crops={self.num_global_crops}, '
                f'blur_radius={self.blur_radius})')


@TRANSFORMS.register_module()
class BatchMultiCrop(BatchViewAugment):
    """The views of ``MultiCrop`` (two global crops, ``num_local_crops`` local ones, BYOL's
    asymmetric augmentations) for a batch of images of one size: the random resized crop
    (aspect ratio 3/4 to 4/3, ten tries, then the centre crop) with PIL's bicubic
    resampling, then :class:`BatchViewAugment`'s augmentations, with the same parameters
    drawn from the same ranges as the per-image pipeline.

    The arguments are ``MultiCrop``'s of the same names, with the same defaults (its
    resampling choices aside: here always PIL's bicubic); ``blur_radius`` is the blur's
    standard deviation range in crop pixels.
    """

    def __init__(self,
                 global_size: int = 224,
                 local_size: int = 96,
                 num_local_crops: int = 8,
                 global_scale: Sequence[float] = (0.4, 1.0),
                 local_scale: Sequence[float] = (0.05, 0.4),
                 blur_radius: Sequence[float] = (0.1, 2.0)) -> None:
        check_crop_sizes(global_size, local_size, num_local_crops)
        super().__init__(blur_radius=blur_radius)
        # (size, scale, blur and solarize probabilities of each view) of each group of views
        self.groups = [(global_size, tuple(global_scale), (1.0, 0.1), (0.0, 0.2))]
        if num_local_crops:
            self.groups.append((local_size, tuple(local_scale), (0.5, ) * num_local_crops,
                                (0.0, ) * num_local_crops))

    def __call__(self, images: torch.Tensor) -> List[torch.Tensor]:
        """Views of (B, 3, H, W) images with values in [0, 255]: the global views, then the
        local ones, each (B, 3, size, size), as ``MultiView`` orders them."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(
                f'BatchMultiCrop takes a batch of images of one size, (B, 3, H, W), got '
                f'{_describe(images)}. If the images differ in size, resize them to one size '
                'first, or put MultiCrop in the dataset pipeline instead.')
        views, images = [], images.float()
        for size, scale, blur_probs, solarize_probs in self.groups:
            copies, batch, device = len(blur_probs), images.shape[0], images.device
            x = self._crop_and_resize(images.repeat(copies, 1, 1, 1), size, scale)
            group = self._augment(x, per_view(blur_probs, batch, device),
                                  per_view(solarize_probs, batch, device),
                                  any(solarize_probs))
            views += list(group.chunk(copies))
        return views

    @staticmethod
    def _crop_and_resize(x: torch.Tensor, size: int, scale: Tuple[float, float]
                         ) -> torch.Tensor:
        n, _, height, width = x.shape
        top, left, crop_h, crop_w = crop_boxes(n, height, width, scale, device=x.device)
        rows = resize_weights(top, crop_h, height, size).to(x)
        cols = resize_weights(left, crop_w, width, size).to(x)
        return to_uint8_grid(rows[:, None] @ x @ cols[:, None].transpose(-1, -2))

    def __repr__(self) -> str:
        sizes = ', '.join(f'{len(blur)} x {size} px {scale}' for size, scale, blur, _ in
                          self.groups)
        return f'{self.__class__.__name__}({sizes}, blur_radius={self.blur_radius})'


def crop_boxes(n: int, height: int, width: int, scale: Tuple[float, float],
               ratio: Tuple[float, float] = (3 / 4, 4 / 3), attempts: int = 10,
               device: Optional[torch.device] = None
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mmpretrain's ``RandomResizedCrop.rand_crop_params`` for ``n`` crops at once: up to
    ``attempts`` draws of area and log-aspect-ratio, the first that fits wins, else the
    whole image clipped to ``ratio`` (centred).

    Returns:
        tuple: ``top``, ``left``, ``crop_h``, ``crop_w``, each (n,) int64 on ``device``.
    """
    def uniform(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.float64, device=device)

    area = uniform(n, attempts).uniform_(*scale) * height * width
    log_ratio = uniform(n, attempts).uniform_(math.log(ratio[0]), math.log(ratio[1]))
    crop_w = torch.round(torch.sqrt(area * log_ratio.exp())).long()
    crop_h = torch.round(torch.sqrt(area / log_ratio.exp())).long()
    fits = (crop_w > 0) & (crop_w <= width) & (crop_h > 0) & (crop_h <= height)
    first = fits.float().argmax(1, keepdim=True)
    crop_w, crop_h = crop_w.gather(1, first)[:, 0], crop_h.gather(1, first)[:, 0]
    found = fits.any(1)
    in_ratio = width / height
    fallback_w = width if in_ratio <= ratio[1] else int(round(height * ratio[1]))
    fallback_h = height if in_ratio >= ratio[0] else int(round(width / ratio[0]))
    crop_w = torch.where(found, crop_w, torch.full_like(crop_w, fallback_w))
    crop_h = torch.where(found, crop_h, torch.full_like(crop_h, fallback_h))
    # A uniform offset among the positions that keep the crop inside the image.
    top = (torch.rand(n, dtype=torch.float64, device=device) * (height - crop_h + 1)).long()
    left = (torch.rand(n, dtype=torch.float64, device=device) * (width - crop_w + 1)).long()
    top = torch.where(found, top, (height - crop_h) // 2)
    left = torch.where(found, left, (width - crop_w) // 2)
    return top, left, crop_h, crop_w


def _describe(inputs) -> str:
    if isinstance(inputs, torch.Tensor):
        return f'one tensor of shape {tuple(inputs.shape)}'
    shapes = sorted({tuple(item.shape) for item in inputs if isinstance(item, torch.Tensor)})
    return f'a list of {len(inputs)} tensors of shapes {shapes}'


@MODELS.register_module()
class MultiCropDataPreprocessor(SelfSupDataPreprocessor):
    """mmpretrain's ``SelfSupDataPreprocessor`` that, in training, first makes the batch's
    multi-crop views on the model's device with a batched transform: by default
    :class:`BatchMultiCrop` (images of one size in, views out); with
    :class:`BatchViewAugment`, the views that the workers cut go in. Outside training (k-NN,
    pictures) images pass as they are.

    Two things differ from the parent, both for the GPU:

    - **float32 views.** mmengine calls the preprocessor inside the optimiser wrapper's
      autocast context; the views are made and normalised with autocast off, so the blur and
      the resize (matrix products) do not run in bfloat16 or float16. DINO's views are 8-bit
      PIL images normalised in float32.
    - **BGR to RGB by ``flip``.** The parent swaps the channels with ``x[:, [2, 1, 0]]``,
      whose Python list becomes an index tensor copied to the GPU (a stream synchronisation)
      once per view; ``flip(1)`` gives the same values with no copy.

    Args:
        multi_crop (dict): The batched transform, built from mmpretrain's ``TRANSFORMS``.
        **kwargs: ``SelfSupDataPreprocessor``'s arguments (mean, std, to_rgb,
            non_blocking, ...).
    """

    def __init__(self, multi_crop: dict, **kwargs) -> None:
        super().__init__(**kwargs)
        self.multi_crop = TRANSFORMS.build(multi_crop)

    def forward(self, data: dict, training: bool = False) -> dict:
        if not isinstance(data, dict):
            raise TypeError('MultiCropDataPreprocessor takes the dict of default_collate '
                            f"(collate_fn=dict(type='default_collate')), got {type(data)}.")
        # With pinned loader memory (pin_memory=True) the copies overlap the queued work.
        data = self.cast_data(data)
        with float32_region(self.device):
            inputs = self.multi_crop(data['inputs']) if training else data['inputs']
            inputs = (self._normalise(inputs) if isinstance(inputs, torch.Tensor)
                      else [self._normalise(view) for view in inputs])
        return dict(inputs=inputs, data_samples=data.get('data_samples'))

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        """The parent's channel swap, float conversion and normalisation of one tensor."""
        if self._channel_conversion:
            x = x.flip(1)
        x = x.float()
        return (x - self.mean) / self.std if self._enable_normalize else x
