"""The Quick-start demo's images: real textures bundled with scikit-image.

Six images ship inside the scikit-image wheel (no download at run time): brick, grass and
gravel (material textures), the moon's surface, an immunohistochemistry slide and the
Hubble deep field. Each is cut into non-overlapping 32 x 32 patches (non-overlapping, so no
pixel is shared between the train and held-out splits), and a patch's class is its source
image. Raw pixels are a poor feature for this task (weighted kNN on raw pixels stays far
below 90 %, see README), which leaves room for pretraining to show what it learns.

The output is an image folder per split, one sub-folder per class, readable by
mmpretrain's ``CustomDataset`` (``tools/demo.py`` writes it).
"""
import json
import os
import os.path as osp
from typing import List, Tuple

import numpy as np

SOURCES = ('brick', 'grass', 'gravel', 'moon', 'immunohistochemistry', 'hubble_deep_field')


def texture_patches(patch: int = 32, per_class: int = 256,
                    seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """(N, patch, patch, 3) uint8 RGB patches and their class indices."""
    from skimage import data
    from skimage.color import gray2rgb
    from skimage.util import img_as_ubyte

    rng = np.random.RandomState(seed)
    images, labels = [], []
    for label, name in enumerate(SOURCES):
        img = img_as_ubyte(getattr(data, name)())
        img = gray2rgb(img) if img.ndim == 2 else img[..., :3]
        height, width = img.shape[:2]
        grid = [img[i:i + patch, j:j + patch]
                for i in range(0, height - patch + 1, patch)
                for j in range(0, width - patch + 1, patch)]
        keep = rng.choice(len(grid), min(per_class, len(grid)), replace=False)
        images += [grid[k] for k in sorted(keep)]
        labels += [label] * len(keep)
    return np.stack(images), np.array(labels)


def stratified_split(labels: np.ndarray, held_out: float = 0.25,
                     seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Indices of (train, held-out), the same fraction held out of every class."""
    rng = np.random.RandomState(seed)
    test: List[int] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        test += idx[:int(round(len(idx) * held_out))].tolist()
    test_idx = np.sort(np.array(test))
    return np.setdiff1d(np.arange(len(labels)), test_idx), test_idx


def write_demo_dataset(out: str, patch: int = 32, per_class: int = 256, seed: int = 0) -> dict:
    """Write `out/{train,val}/<class>/<i>.png` once; return the summary."""
    from PIL import Image

    stamp = osp.join(out, 'dataset.json')
    if osp.exists(stamp):
        with open(stamp) as f:
            summary = json.load(f)
        if summary.get('patch') == patch and summary.get('per_class') == per_class:
            return summary
    images, labels = texture_patches(patch, per_class, seed)
    splits = dict(zip(('train', 'val'), stratified_split(labels, 0.25, seed)))
    for split, indices in splits.items():
        for i in indices:
            folder = osp.join(out, split, SOURCES[labels[i]])
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(images[i]).save(osp.join(folder, f'{i:05d}.png'))
    summary = dict(classes=list(SOURCES), patch=patch, per_class=per_class, seed=seed,
                   train=len(splits['train']), val=len(splits['val']))
    with open(stamp, 'w') as f:
        json.dump(summary, f, indent=2)
    return summary
