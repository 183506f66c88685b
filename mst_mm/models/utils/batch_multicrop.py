"""DINO's multi-crop for a batch of same-size images, as a few tensor operations.

``MultiCrop`` (``mst_mm/datasets/transforms.py``) makes the views image by image in the data
workers, a dozen PIL and numpy calls per view; on 32-px images those calls, not the pixels,
are the cost. :class:`BatchMultiCrop` draws the same augmentation parameters from the same
ranges and applies them to the whole batch at once, inside :class:`MultiCropDataPreprocessor`
(on the training device). It needs images of one size, so it serves small fixed-size data
sets; ImageNet-style folders of any size keep ``MultiCrop``. What differs from the per-image
pipeline is the arithmetic, not the distribution: float operations rounded to the uint8 grid
after each step, where PIL works in fixed point (docs/benchmarks.md).
"""
import math
from typing import List, Sequence, Tuple

import torch
from mmpretrain.models import SelfSupDataPreprocessor
from mmpretrain.registry import MODELS, TRANSFORMS

# BGR weights of PIL's RGB -> L conversion (ITU-R 601), used by contrast and saturation.
_LUMA_BGR = (0.114, 0.587, 0.299)


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
        Tensor: (N, out_size, in_size); ``weights @ image`` resizes along this axis.
    """
    start, length = start.float()[:, None, None], length.float()[:, None, None]
    scale = length / out_size
    centre = start + (torch.arange(out_size, dtype=torch.float32)[:, None] + 0.5) * scale
    pixel = torch.arange(in_size, dtype=torch.float32) + 0.5
    weights = _cubic((pixel - centre) / scale.clamp(min=1))
    weights = weights * ((pixel > start) & (pixel < start + length))
    return weights / weights.sum(-1, keepdim=True)


def blur_weights(sigma: torch.Tensor, size: int) -> torch.Tensor:
    """A Gaussian blur of standard deviation ``sigma`` along one axis as a matrix, edges
    extended (as PIL's ``GaussianBlur``, whose radius is the standard deviation).

    Args:
        sigma (Tensor): (N,) standard deviations in pixels; 0 leaves the row unchanged.
        size (int): The axis length.

    Returns:
        Tensor: (N, size, size).
    """
    reach = max(1, math.ceil(3 * float(sigma.max()))) if sigma.numel() else 1
    offsets = torch.arange(-reach, reach + 1, dtype=torch.float32)
    taps = torch.exp(-0.5 * (offsets / sigma[:, None].clamp(min=1e-6))**2)
    taps = taps / taps.sum(-1, keepdim=True)                     # (N, taps)
    rows = torch.arange(size)
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


def _luma(x: torch.Tensor) -> torch.Tensor:
    b, g, r = x.unbind(1)
    return (_LUMA_BGR[0] * b + _LUMA_BGR[1] * g + _LUMA_BGR[2] * r).unsqueeze(1)


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
    n = torch.tensor([5.0, 3.0, 1.0], device=x.device).view(1, 3, 1, 1)  # R, G, B
    k = (n + 6 * hue.unsqueeze(1)) % 6
    rgb = high.unsqueeze(1) - delta.unsqueeze(1) * torch.clamp(torch.minimum(k, 4 - k), 0, 1)
    return rgb.flip(1)                                                  # back to BGR


def _jitter(x: torch.Tensor, op: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """One of mmcv's pillow colour operations per image, ``op`` 0 brightness, 1 contrast,
    2 saturation, 3 hue, -1 none. The first three are PIL's blends of the image with an
    anchor, ``anchor + f (x - anchor)``: black, the mean grey level, the grey image."""
    contrast = (op == 1).to(x).view(-1, 1, 1, 1)
    saturation = (op == 2).to(x).view(-1, 1, 1, 1)
    luma = _luma(x)
    anchor = (contrast * _to_uint8_grid(luma.mean((2, 3), keepdim=True))
              + saturation * _to_uint8_grid(luma))
    # Images whose op is no blend get factor 1: anchor + (x - anchor) is x, exactly, as
    # both are whole numbers.
    blend = ((op >= 0) & (op <= 2)).to(x)
    factor_or_one = (blend * factor + (1 - blend)).view(-1, 1, 1, 1)
    x = _to_uint8_grid(anchor + factor_or_one * (x - anchor))
    hue = (op == 3).nonzero().squeeze(1)
    if hue.numel():
        x[hue] = _to_uint8_grid(_rotate_hue(x[hue], factor[hue]))
    return x


@TRANSFORMS.register_module()
class BatchMultiCrop:
    """The views of ``MultiCrop`` (two global crops, ``num_local_crops`` local ones, BYOL's
    asymmetric augmentations) for a batch of images of one size, with the same parameters
    drawn from the same ranges: random resized crop (aspect ratio 3/4 to 4/3, ten tries,
    then the centre crop) with bicubic resampling, horizontal flip (0.5), colour jitter
    (0.8; brightness and contrast 0.4, saturation 0.2, hue 0.1, in random order), grayscale
    (0.2), Gaussian blur (1.0, 0.1 and 0.5 for the first global, the second global and the
    local crops) and solarisation (0.2, second global crop). The random draws come from
    torch's generator, so ``randomness=dict(seed=...)`` fixes them.

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
        self.blur_radius = tuple(blur_radius)
        # (size, scale, blur and solarize probabilities of each view) of each group of views
        self.groups = [(global_size, tuple(global_scale), (1.0, 0.1), (0.0, 0.2))]
        if num_local_crops:
            self.groups.append((local_size, tuple(local_scale), (0.5, ) * num_local_crops,
                                (0.0, ) * num_local_crops))

    def __call__(self, images: torch.Tensor) -> List[torch.Tensor]:
        """Views of (B, 3, H, W) images with values in [0, 255]: the global views, then the
        local ones, each (B, 3, size, size), as ``MultiView`` orders them."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f'BatchMultiCrop takes (B, 3, H, W) images, got '
                             f'{tuple(images.shape)}.')
        views = []
        for size, scale, blur_probs, solarize_probs in self.groups:
            copies = len(blur_probs)
            per_view = torch.tensor([blur_probs, solarize_probs]).repeat_interleave(
                images.shape[0], dim=1)
            group = self._augment(images.repeat(copies, 1, 1, 1), size, scale, *per_view)
            views += list(group.chunk(copies))
        return views

    def _augment(self, x: torch.Tensor, size: int, scale: Tuple[float, float],
                 blur_prob: torch.Tensor, solarize_prob: torch.Tensor) -> torch.Tensor:
        n, _, height, width = x.shape
        top, left, crop_h, crop_w = crop_boxes(n, height, width, scale)
        rows = resize_weights(top, crop_h, height, size).to(x)
        cols = resize_weights(left, crop_w, width, size).to(x)
        x = _to_uint8_grid(rows[:, None] @ x @ cols[:, None].transpose(-1, -2))

        flip = (torch.rand(n) < 0.5).to(x.device)
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)

        jittered = torch.rand(n) < 0.8
        order = torch.rand(n, 4).argsort(1)
        factors = torch.stack([torch.empty(n).uniform_(0.6, 1.4),
                               torch.empty(n).uniform_(0.6, 1.4),
                               torch.empty(n).uniform_(0.8, 1.2),
                               torch.empty(n).uniform_(-0.1, 0.1)], 1)
        for position in range(4):
            op = torch.where(jittered, order[:, position], -1)
            factor = factors.gather(1, op.clamp(min=0)[:, None])[:, 0]
            x = _jitter(x, op.to(x.device), factor.to(x))

        # mmcv's RandomGrayscale: the config's BGR weights, normalised, truncated to uint8.
        gray = (torch.rand(n) < 0.2).to(x.device)
        b, g, r = x.unbind(1)
        luma = ((0.114 * b + 0.587 * g + 0.2989 * r) / (0.114 + 0.587 + 0.2989)).floor()
        x = torch.where(gray.view(-1, 1, 1, 1), luma.unsqueeze(1).expand_as(x), x)

        blurred = torch.rand(n) < blur_prob
        sigma = torch.empty(n).uniform_(*self.blur_radius) * blurred
        if blurred.any():
            kernel = blur_weights(sigma, size).to(x)
            x = _to_uint8_grid(kernel[:, None] @ x @ kernel[:, None].transpose(-1, -2))

        if solarize_prob.any():
            solarized = (torch.rand(n) < solarize_prob).to(x.device).view(-1, 1, 1, 1)
            x = torch.where(solarized & (x >= 128), 255 - x, x)
        return x

    def __repr__(self) -> str:
        sizes = ', '.join(f'{len(blur)} x {size} px {scale}' for size, scale, blur, _ in
                          self.groups)
        return f'{self.__class__.__name__}({sizes}, blur_radius={self.blur_radius})'


def crop_boxes(n: int, height: int, width: int, scale: Tuple[float, float],
               ratio: Tuple[float, float] = (3 / 4, 4 / 3), attempts: int = 10
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mmpretrain's ``RandomResizedCrop.rand_crop_params`` for ``n`` crops at once: up to
    ``attempts`` draws of area and log-aspect-ratio, the first that fits wins, else the
    whole image clipped to ``ratio`` (centred).

    Returns:
        tuple: ``top``, ``left``, ``crop_h``, ``crop_w``, each (n,) int64.
    """
    area = torch.empty(n, attempts, dtype=torch.float64).uniform_(*scale) * height * width
    log_ratio = torch.empty(n, attempts, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]))
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
    top = (torch.rand(n, dtype=torch.float64) * (height - crop_h + 1)).long()
    left = (torch.rand(n, dtype=torch.float64) * (width - crop_w + 1)).long()
    top = torch.where(found, top, (height - crop_h) // 2)
    left = torch.where(found, left, (width - crop_w) // 2)
    return top, left, crop_h, crop_w


@MODELS.register_module()
class MultiCropDataPreprocessor(SelfSupDataPreprocessor):
    """mmpretrain's ``SelfSupDataPreprocessor`` that, in training, first turns each batch
    of same-size images into the multi-crop views with a batched transform (by default
    :class:`BatchMultiCrop`). Outside training (k-NN, pictures) images pass as they are.

    Args:
        multi_crop (dict): The batched transform, built from mmpretrain's ``TRANSFORMS``.
        **kwargs: ``SelfSupDataPreprocessor``'s arguments (mean, std, to_rgb, ...).
    """

    def __init__(self, multi_crop: dict, **kwargs) -> None:
        super().__init__(**kwargs)
        self.multi_crop = TRANSFORMS.build(multi_crop)

    def forward(self, data: dict, training: bool = False) -> dict:
        if not training:
            return super().forward(data, training)
        images = data['inputs']
        if not isinstance(images, torch.Tensor):
            raise ValueError(
                f'{type(self.multi_crop).__name__} crops a batch of images of one size '
                '(one tensor), got a list: the images differ in size. Resize them to one '
                'size first, or put MultiCrop in the dataset pipeline instead.')
        views = self.multi_crop(images.to(self.device).float())
        return super().forward(dict(data, inputs=views), training)
