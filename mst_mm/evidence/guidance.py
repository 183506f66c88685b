"""Where the teacher's attention and the guided mask fall, measured against object masks.

The paper motivates the attention-guided mask (Sec. 3.2) by the teacher's CLS attention:
patches it attends least are background, so masking them spares the object. With pixel
masks of the objects, that can be measured:

- ``attention_on_object_share``: the CLS attention mass on object patches,
  :math:`\\sum_{i \\in O} Attn_i / \\sum_i Attn_i`, averaged over images; a teacher that
  ignores the object gives the object's area share.
- ``candidates_on_object_share``: of the ``N // num`` lowest-attention patches (the mask
  candidates of Eq. 6), the share on the object, pooled over images; a random choice of
  patches gives the object's area share.
- ``masked_on_object_share``: the same for the patches that Eq. 6 masks with probability
  ``p`` (one fixed draw), pooled over images.
- ``object_area_share``: object patches / all patches, averaged over images: the level
  that every share above takes when the attention carries no information about the object.

A patch counts as object when at least half of its pixels are.
"""
from typing import Dict

import torch
import torch.nn.functional as F

from ..models.utils import attention_mask


def patch_object_mask(pixel_masks: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, H, W) bool pixel masks -> (B, N) bool, True where >= half a patch is object;
    patches numbered row by row, as the ViT's tokens are."""
    if pixel_masks.dim() != 3:
        raise ValueError(f'pixel_masks must be (B, H, W), got {tuple(pixel_masks.shape)}.')
    cover = F.avg_pool2d(pixel_masks[:, None].float(), patch_size)  # (B, 1, h, w)
    return (cover >= 0.5).flatten(1)


def guidance_shares(attn: torch.Tensor, object_patches: torch.Tensor, num: int = 8,
                    p: float = 0.1, seed: int = 0) -> Dict[str, float]:
    """The four shares of the module docstring, in [0, 1], for (B, N) CLS-to-patch attention
    (Eq. 5) and :func:`patch_object_mask`'s object patches; the lowest ``1/num`` patches are
    candidates, each masked with probability ``p`` in one draw seeded by ``seed``."""
    if attn.shape != object_patches.shape:
        raise ValueError(f'attn {tuple(attn.shape)} and object_patches '
                         f'{tuple(object_patches.shape)} must have the same (B, N) shape.')
    obj = object_patches.bool()
    attn = attn.float()
    on_object = (attn * obj).sum(1) / attn.sum(1)
    candidates = attention_mask(attn, num=num, p=1.0, mode='attention')
    generator = torch.Generator(device=attn.device).manual_seed(seed)
    masked = attention_mask(attn, num=num, p=p, mode='attention', generator=generator)

    def pooled_share(chosen: torch.Tensor) -> float:
        total = chosen.sum()
        return float((chosen & obj).sum() / total) if total > 0 else float('nan')

    return dict(object_area_share=float(obj.float().mean(1).mean()),
                attention_on_object_share=float(on_object.mean()),
                candidates_on_object_share=pooled_share(candidates),
                masked_on_object_share=pooled_share(masked))
