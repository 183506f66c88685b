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

# PIL's RGB -> L conversion in 16-bit fixed point, rounded (Convert.c, L24), for B, G, R.
# In float32 it is exact: every partial sum of whole grey levels stays below 2**24.
_L24_BGR = (7471.0, 38470.0, 19595.0)

def _cubic(x: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """PIL's bicubic kernel (Keys, a = -0.5)."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1, near, far * (x < 2))


def resize_weights(start: torch.Tensor, length: torch.Tensor, in_size: int,
                   out_size: int) -> torch.Tensor:
    r"""The rows of one axis of a crop-and-resize as a matrix, as PIL's bicubic resampling
    with antialiasing computes them: output pixel :math:`o` of a crop starting at :math:`s`
    of length :math:`l` is centred on :math:`c_o = s + (o + \frac12)\,l / n` and weighs
    input pixel :math:`i` of the crop by :math:`k((i + \frac12 - c_o) / \sigma)`, with
    :math:`\sigma = \max(l / n, 1)` widening the kernel when shrinking; each row sums to 1.

    Args:
        start (Tensor): (N,) first pixel of each crop on this axis.
        length (Tensor): (N,) crop length on this axis.
        in_size (int): The image's length on this axis.
        out_size (int): The output length :math:`n`.

    Returns:
        Tensor: (N, out_size, in_size) on ``start``'s device; ``weights @ image`` resizes
        along this axis.
    """
    device = start.device
    start, length = start.float()[:, None, None], length.float()[:, None, None]
    scale = length / out_size
    centre = start + (torch.arange(out_size, dtype=torch.float32, device=device)[:, None]
                      + 0.5) * scale
    pixel = torch.arange(in_size, dtype=torch.float32, device=device) + 0.5
    weights = _cubic((pixel - centre) / scale.clamp(min=1))
    weights = weights * ((pixel > start) & (pixel < start + length))
    return weights / weights.sum(-1, keepdim=True)


def blur_weights(sigma: torch.Tensor, size: int, max_sigma: float) -> torch.Tensor:
    """A Gaussian blur of standard deviation ``sigma`` along one axis as a matrix, edges
    extended (as PIL's ``GaussianBlur``, whose radius is the standard deviation), with taps
    out to three times the batch's largest ``sigma``.

    Args:
        sigma (Tensor): (N,) standard deviations in pixels; 0 leaves the row unchanged.
        size (int): The axis length.
        max_sigma (float): An upper bound of ``sigma`` (the range's end): it fixes the
            matrix's band without reading ``sigma`` back from the device.

    Returns:
        Tensor: (N, size, size) on ``sigma``'s device.
    """
    bound = max(1, math.ceil(3 * max_sigma))
    offsets = torch.arange(-bound, bound + 1, dtype=torch.float32, device=sigma.device)
    # Taps beyond the batch's own reach are zero, as if the band stopped there.
    reach = torch.ceil(3 * sigma.max()).clamp(min=1) if sigma.numel() else sigma.new_ones(())
    taps = torch.exp(-0.5 * (offsets / sigma[:, None].clamp(min=1e-6))**2)
    taps = taps * (offsets.abs() <= reach)
    taps = taps / taps.sum(-1, keepdim=True)                     # (N, taps)
    rows = torch.arange(size, device=sigma.device)
    source = (rows[None, :] + offsets.long()[:, None]).clamp(0, size - 1)  # (taps, size)
    shifts = torch.nn.functional.one_hot(source, size).float()  # (taps, size, size)
    return torch.einsum('nk,kij->nij', taps, shifts)


def check_crop_sizes(global_size: int, local_size: int, num_local_crops: int) -> None:
    """Refuse crop settings that cannot make DINO's views, naming the fix."""
    if local_size > global_size:
        raise ValueError(f'Local crops ({local_size} px) must not be larger than global '
                         f'crops ({global_size} px): swap them or shrink local_size.')
    if num_local_crops < 0:
        raise ValueError(f'num_local_crops must be >= 0, got {num_local_crops}.')


def _to_uint8_grid(x: torch.Tensor) -> torch.Tensor:
    return x.round_().clamp_(0, 255)


def _pil_luma(x: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert('L')`` of BGR images with whole grey levels: (N, 1, H, W)."""
    b, g, r = x.unbind(1)
    weighted = _L24_BGR[0] * b + _L24_BGR[1] * g + _L24_BGR[2] * r + 32768.0
    return torch.floor(weighted / 65536.0).unsqueeze(1)


def _rotate_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the hue of BGR images in [0, 255] by ``shift`` turns (HSV, as mmcv's
    ``adjust_hue``)."""
    b, g, r = x.unbind(1)
    high, low = x.amax(1), x.amin(1)
    delta = high - low
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    hue = torch.where(high == r, (g - b) / safe,
                      torch.where(high == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    hue = torch.where(delta > 0, hue / 6, torch.zeros_like(hue))
    # mmcv adds trunc(255 shift) to PIL's 8-bit hue, modulo 256: the same steps here.
    steps = torch.trunc(shift * 255) % 256
    hue = (hue + steps[:, None, None] / 256) % 1.0
    # HSV -> RGB with k = (n + 6 h) mod 6: c = v - delta * clamp(min(k, 4 - k), 0, 1).
    n = torch.arange(5.0, 0.0, -2.0, device=x.device).view(1, 3, 1, 1)  # R, G, B: 5, 3, 1
    k = (n + 6 * hue.unsqueeze(1)) % 6
    rgb = high.unsqueeze(1) - delta.unsqueeze(1) * torch.clamp(torch.minimum(k, 4 - k), 0, 1)
    return rgb.flip(1)                                                  # back to BGR


def _blend(x: torch.Tensor, op: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """One of mmcv's pillow blends per image, ``op`` 0 brightness, 1 contrast, 2 saturation,
    anything else none, with PIL's arithmetic (``ImageEnhance``, ``Image.blend``): the float
    ``anchor + f (x - anchor)`` truncated to uint8, with the anchor black, the grey image's
    mean rounded half up, or the grey image (PIL's rounded ``convert('L')``)."""
    contrast = (op == 1).to(x).view(-1, 1, 1, 1)
    saturation = (op == 2).to(x).view(-1, 1, 1, 1)
    luma = _pil_luma(x)
    # ImageStat's mean in float64, then int(mean + 0.5): PIL's contrast anchor, exactly.
    mean = luma.sum((2, 3), keepdim=True, dtype=torch.float64) / luma[0].numel()
    anchor = contrast * torch.floor(mean + 0.5).to(x) + saturation * luma
    # Images whose op is no blend get factor 1: anchor + (x - anchor) is x, exactly, as
    # both are whole numbers.
    blend = ((op >= 0) & (op <= 2)).to(x)
    factor_or_one = (blend * factor + (1 - blend)).view(-1, 1, 1, 1)
    return (anchor + factor_or_one * (x - anchor)).clamp_(0, 255).floor_()


def _jitter(x: torch.Tensor, jittered: torch.Tensor, order: torch.Tensor,
            factors: torch.Tensor) -> torch.Tensor:
    """mmcv's pillow colour jitter of the ``jittered`` images: brightness (0), contrast (1),
    saturation (2) and hue (3) in each image's ``order`` (n, 4), with ``factors`` (n, 4).

    Each image meets its blends before the hue rotation, the rotation, then the blends
    after it: one rotation per image (the costly operation) without reading back from the
    device which images rotate at which step."""
    ops = torch.where(jittered[:, None], order, -1)
    hue_at = (ops == 3).int().argmax(1, keepdim=True)
    steps = torch.arange(4, device=x.device)
    before = torch.where(steps < hue_at, ops, -1)
    after = torch.where(steps > hue_at, ops, -1)
    def blend(x: torch.Tensor, op: torch.Tensor) -> torch.Tensor:
        return _blend(x, op, factors.gather(1, op.clamp(min=0)[:, None])[:, 0])

    for step in range(3):
        x = blend(x, before[:, step])
    rotated = _to_uint8_grid(_rotate_hue(x, factors[:, 3]))
    x = torch.where(jittered.view(-1, 1, 1, 1), rotated, x)
    for step in range(1, 4):
        x = blend(x, after[:, step])
    return x


def _flip(x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Mirror the ``chosen`` images left to right (mmcv's horizontal ``imflip``)."""
    return torch.where(chosen.view(-1, 1, 1, 1), x.flip(-1), x)


def _grayscale(x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """DINO's ``RandomGrayscale`` (torchvision: PIL's rounded ``convert('L')``) of the
    ``chosen`` BGR images, in 3 channels."""
    return torch.where(chosen.view(-1, 1, 1, 1), _pil_luma(x).expand_as(x), x)


def _solarize(x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """mmcv's ``solarize`` (threshold 128) of the ``chosen`` images: ``255 - x`` where
    ``x >= 128``."""
    return torch.where(chosen.view(-1, 1, 1, 1) & (x >= 128), 255 - x, x)


def _per_view(probabilities: Sequence[float], batch_size: int,
              device: torch.device) -> torch.Tensor:
    """Each view's probability repeated for the images of a batch, made on ``device``."""
    return torch.cat([torch.full((batch_size, ), p, device=device) for p in probabilities])


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
        return list(self._augment(x, _per_view(blur_probs, batch, device),
                                  _per_view(solarize_probs, batch, device),
                                  any(solarize_probs)).chunk(len(views)))

    def _augment(self, x: torch.Tensor, blur_prob: torch.Tensor, solarize_prob: torch.Tensor,
                 may_solarize: bool) -> torch.Tensor:
        n, device = x.shape[0], x.device
        x = _flip(x, torch.rand(n, device=device) < 0.5)

        jittered = torch.rand(n, device=device) < 0.8
        order = torch.rand(n, 4, device=device).argsort(1)
        factors = torch.stack([torch.empty(n, device=device).uniform_(0.6, 1.4),
                               torch.empty(n, device=device).uniform_(0.6, 1.4),
                               torch.empty(n, device=device).uniform_(0.8, 1.2),
                               torch.empty(n, device=device).uniform_(-0.1, 0.1)], 1)
        x = _jitter(x, jittered, order, factors.to(x))

        x = _grayscale(x, torch.rand(n, device=device) < 0.2)

        # Unblurred views get sigma 0, an identity matrix: the product leaves them exact.
        blurred = torch.rand(n, device=device) < blur_prob
        sigma = torch.empty(n, device=device).uniform_(*self.blur_radius) * blurred
        kernel = blur_weights(sigma, x.shape[-1], self.blur_radius[1]).to(x)
        x = _to_uint8_grid(kernel[:, None] @ x @ kernel[:, None].transpose(-1, -2))

        if may_solarize:
            x = _solarize(x, torch.rand(n, device=device) < solarize_prob)
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
            group = self._augment(x, _per_view(blur_probs, batch, device),
                                  _per_view(solarize_probs, batch, device),
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
        return _to_uint8_grid(rows[:, None] @ x @ cols[:, None].transpose(-1, -2))

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
