"""The evidence run's probe images: class folders read once into memory, fed in batches to
:func:`mst_mm.models.algorithms.feature_embedder.embed_images`."""
import os
import os.path as osp
from typing import Iterator, List, Tuple

import numpy as np
import torch


def class_folder_files(root: str) -> Tuple[List[str], torch.Tensor]:
    """``root/<class>/*`` as relative paths and labels, in mmpretrain's ``CustomDataset``
    order (sorted classes, sorted files), so that dataset indices address the same images."""
    if not osp.isdir(root):
        raise FileNotFoundError(f'No image folder {root}: write it first '
                                '(python tools/misc/write_animal_shapes.py data/animal_shapes).')
    classes = sorted(d for d in os.listdir(root) if osp.isdir(osp.join(root, d)))
    paths, labels = [], []
    for label, cls in enumerate(classes):
        names = sorted(os.listdir(osp.join(root, cls)))
        paths += [f'{cls}/{name}' for name in names]
        labels += [label] * len(names)
    if not paths:
        raise FileNotFoundError(f'No images under {root}/<class>/.')
    return paths, torch.tensor(labels)


def load_class_folders(root: str) -> Tuple[np.ndarray, torch.Tensor, List[str]]:
    """``root/<class>/*.png`` as a (N, H, W, 3) uint8 RGB array, labels and relative paths,
    in :func:`class_folder_files` order."""
    from PIL import Image
    paths, labels = class_folder_files(root)
    images = [np.array(Image.open(osp.join(root, p)).convert('RGB')) for p in paths]
    return np.stack(images), labels, paths


def image_batches(images: np.ndarray, batch_size: int = 500) -> Iterator[torch.Tensor]:
    """(N, H, W, 3) uint8 images as (B, 3, H, W) tensors."""
    for start in range(0, len(images), batch_size):
        yield torch.from_numpy(images[start:start + batch_size]).permute(0, 3, 1, 2)
