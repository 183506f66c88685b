"""The tensor operations behind the batched views (:mod:`.batch_multicrop`): resize and blur
weights, and the colour operations in PIL's arithmetic (truncated blends, PIL's L24 grey),
each on a batch of uint8-valued float views."""
import math
from typing import Sequence

import torch

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


def to_uint8_grid(x: torch.Tensor) -> torch.Tensor:
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


def colour_jitter(x: torch.Tensor, jittered: torch.Tensor, order: torch.Tensor,
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
    rotated = to_uint8_grid(_rotate_hue(x, factors[:, 3]))
    x = torch.where(jittered.view(-1, 1, 1, 1), rotated, x)
    for step in range(1, 4):
        x = blend(x, after[:, step])
    return x


def flip(x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Mirror the ``chosen`` images left to right (mmcv's horizontal ``imflip``)."""
    return torch.where(chosen.view(-1, 1, 1, 1), x.flip(-1), x)


def grayscale(x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """DINO's ``RandomGrayscale`` (torchvision: PIL's rounded ``convert('L')``) of the
    ``chosen`` BGR images, in 3 channels."""
    return torch.where(chosen.view(-1, 1, 1, 1), _pil_luma(x).expand_as(x), x)


def solarize(x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """mmcv's ``solarize`` (threshold 128) of the ``chosen`` images: ``255 - x`` where
    ``x >= 128``."""
    return torch.where(chosen.view(-1, 1, 1, 1) & (x >= 128), 255 - x, x)


def per_view(probabilities: Sequence[float], batch_size: int,
              device: torch.device) -> torch.Tensor:
    """Each view's probability repeated for the images of a batch, made on ``device``."""
    return torch.cat([torch.full((batch_size, ), p, device=device) for p in probabilities])
