"""Frozen features of an MST checkpoint for the probes: one pass over in-memory images."""
import os
import os.path as osp
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn


def load_class_folders(root: str) -> Tuple[np.ndarray, torch.Tensor, List[str]]:
    """``root/<class>/*.png`` as a (N, H, W, 3) uint8 array, labels and relative paths.

    Classes are the sorted folder names (mmpretrain's ``CustomDataset`` order) and images
    are sorted within each class, so the order is the same on every machine.
    """
    from PIL import Image
    if not osp.isdir(root):
        raise FileNotFoundError(f'No image folder {root}: write it first '
                                '(python tools/misc/write_animal_shapes.py data/animal_shapes).')
    classes = sorted(d for d in os.listdir(root) if osp.isdir(osp.join(root, d)))
    images, labels, paths = [], [], []
    for label, cls in enumerate(classes):
        for name in sorted(os.listdir(osp.join(root, cls))):
            images.append(np.array(Image.open(osp.join(root, cls, name)).convert('RGB')))
            labels.append(label)
            paths.append(f'{cls}/{name}')
    if not images:
        raise FileNotFoundError(f'No images under {root}/<class>/.')
    return np.stack(images), torch.tensor(labels), paths


@torch.no_grad()
def embed_images(backbone: nn.Module, mean: torch.Tensor, std: torch.Tensor,
                 images: np.ndarray, batch_size: int = 500,
                 with_attn: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """CLS features (N, C) of a ``MaskViT`` and, with ``with_attn``, its last layer's
    CLS-to-patch attention (N, num_patches), on images normalised as in training.

    Args:
        backbone (nn.Module): A backbone with ``forward_mst`` (``MaskViT``, ``MaskSwin``).
        mean, std (Tensor): The data preprocessor's (3,) or (3, 1, 1) statistics.
        images (ndarray): (N, H, W, 3) uint8 RGB.
    """
    was_training = backbone.training
    backbone.eval()
    mean, std = mean.reshape(1, 3, 1, 1).float(), std.reshape(1, 3, 1, 1).float()
    feats, attns = [], []
    for start in range(0, len(images), batch_size):
        batch = torch.from_numpy(images[start:start + batch_size]).permute(0, 3, 1, 2)
        out = backbone.forward_mst((batch.float() - mean) / std, with_attn=with_attn)
        feats.append(out.global_feat)
        if with_attn:
            attns.append(out.attn)
    backbone.train(was_training)
    return torch.cat(feats), (torch.cat(attns) if with_attn else None)
