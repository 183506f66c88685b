"""What MST sees: attention, masks and reconstruction of one image, as a picture row."""
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..models.utils import attention_mask


def _to_grid(values: torch.Tensor, grid: tuple) -> np.ndarray:
    return values.reshape(*grid).float().cpu().numpy()


@torch.no_grad()
def mst_picture_row(model, image: torch.Tensor,
                    generator: Optional[torch.Generator] = None) -> Dict[str, np.ndarray]:
    """Everything one row of the picture shows, for a normalised RGB image (3, H, W).

    Args:
        model (MST): A (trained) MST model; its teacher gives the attention.
        image (Tensor): The image, normalised as in training.
        generator (torch.Generator, optional): Random source of the two masks.

    Returns:
        dict: ``image`` (H, W, 3) uint8, ``attn`` (h, w), ``attn_heads`` (heads, h, w),
        ``candidates``, ``guided_mask`` and ``random_mask`` (h, w) bool, and
        ``reconstruction`` (H, W, 3) uint8 (absent without a decoder).
    """
    was_training = model.training
    model.eval()
    batch = image.unsqueeze(0)
    teacher_backbone = model.teacher.module[0]
    feats = teacher_backbone.forward_mst(batch, with_attn=True)
    grid = tuple(feats.feat_map.shape[-2:])
    num, p = model.mask_cfg['num'], model.mask_cfg['p']
    guided = attention_mask(feats.attn, num=num, p=p, mode='attention', generator=generator)
    random = attention_mask(feats.attn, num=num, p=p, mode='random', generator=generator)
    candidates = attention_mask(feats.attn, num=num, p=1.0, mode='attention')
    row = dict(
        image=_denormalise(model, image),
        attn=_to_grid(feats.attn[0], grid),
        attn_heads=feats.attn_heads[0].reshape(-1, *grid).float().cpu().numpy(),
        candidates=_to_grid(candidates[0], grid).astype(bool),
        guided_mask=_to_grid(guided[0], grid).astype(bool),
        random_mask=_to_grid(random[0], grid).astype(bool))
    if model.decoder_head is not None:
        student = model.backbone.forward_mst(batch, mask=guided)
        restored = model.decoder_head(student.feat_map)[0]
        row['reconstruction'] = _denormalise(model, restored)
    model.train(was_training)
    return row


def _denormalise(model, image: torch.Tensor) -> np.ndarray:
    preprocessor = model.data_preprocessor
    mean = preprocessor.mean.reshape(3, 1, 1).to(image.device)
    std = preprocessor.std.reshape(3, 1, 1).to(image.device)
    pixels = (image.float() * std + mean).clamp(0, 255)
    return pixels.permute(1, 2, 0).round().byte().cpu().numpy()


def _overlay(image: np.ndarray, grid_mask: np.ndarray, shade: float) -> np.ndarray:
    mask = torch.from_numpy(grid_mask.astype(np.float32))[None, None]
    mask = F.interpolate(mask, size=image.shape[:2], mode='nearest')[0, 0].numpy() > 0
    out = image.astype(np.float32)
    out[mask] = out[mask] * (1 - shade) + 255 * shade * np.array([0.1, 0.3, 1.0])
    return out.clip(0, 255).astype(np.uint8)


def render_rows(rows: List[Dict[str, np.ndarray]], max_heads: int = 6) -> np.ndarray:
    """Draw rows side by side into an RGB uint8 array (matplotlib, no display needed)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    heads = min(max_heads, rows[0]['attn_heads'].shape[0])
    titles = ['input', 'attention (mean)'] + [f'head {h}' for h in range(heads)] + [
        'guided mask', 'random mask', 'reconstruction']
    fig, axes = plt.subplots(len(rows), len(titles), squeeze=False,
                             figsize=(1.6 * len(titles), 1.7 * len(rows)))
    for r, row in enumerate(rows):
        panels = [row['image'], row['attn'], *row['attn_heads'][:heads],
                  _overlay(_overlay(row['image'], row['candidates'], 0.25),
                           row['guided_mask'], 0.8),
                  _overlay(row['image'], row['random_mask'], 0.8),
                  row.get('reconstruction')]
        for ax, title, panel in zip(axes[r], titles, panels):
            ax.axis('off')
            if panel is None:
                continue
            ax.imshow(panel, cmap='inferno' if panel.ndim == 2 else None,
                      interpolation='nearest')
            if r == 0:
                ax.set_title(title, fontsize=7)
    fig.tight_layout()
    fig.canvas.draw()
    picture = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return picture
