"""The Quick-start demo's images: real textures bundled with scikit-image.

Six images ship inside the scikit-image wheel (no download at run time): brick, grass and
gravel (material textures), the moon's surface, an immunohistochemistry slide and the
Hubble deep field. Each is cut into non-overlapping 32 x 32 patches (non-overlapping, so no
pixel is shared between the train and held-out splits), and a patch's class is its source
image.

Colour and brightness alone would give the classes away (a randomly initialised ViT already
reached 90 % kNN top-1 on the colour patches), so every patch is turned to grey and
**rank-equalised**: each grey level is replaced by its rank among the patch's pixels. All
patches then share one flat intensity histogram, and only the spatial arrangement, the
texture, tells the classes apart. Raw pixels and a random backbone are then weak features
(see the README's table), which leaves room for pretraining to show what it learns.

The output is an image folder per split, one sub-folder per class, readable by
mmpretrain's ``CustomDataset`` (``tools/demo.py`` writes it).
"""
import json
import os
import os.path as osp
import shutil
from typing import List, Tuple

import numpy as np

SOURCES = ('brick', 'grass', 'gravel', 'moon', 'immunohistochemistry', 'hubble_deep_field')


DATASET_VERSION = 2  # 1: colour patches; 2: grey, rank-equalised patches


def rank_equalise(gray: np.ndarray) -> np.ndarray:
    """Replace every grey level of an (H, W) patch by its rank, scaled to 0..255 (uint8).

    Tied levels share their average rank, so flat regions stay flat (ranking ties in raster
    order would paint ramps into them, a cue of its own).
    """
    from scipy.stats import rankdata
    ranks = rankdata(gray.reshape(-1), method='average') - 1
    scaled = np.round(ranks * 255.0 / max(ranks.size - 1, 1))
    return scaled.reshape(gray.shape).astype(np.uint8)


def texture_patches(patch: int = 32, per_class: int = 256,
                    seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """(N, patch, patch) uint8 grey, rank-equalised patches and their class indices."""
    from skimage import data
    from skimage.color import rgb2gray
    from skimage.util import img_as_ubyte

    rng = np.random.RandomState(seed)
    images, labels = [], []
    for label, name in enumerate(SOURCES):
        img = img_as_ubyte(getattr(data, name)())
        img = img if img.ndim == 2 else img_as_ubyte(rgb2gray(img[..., :3]))
        height, width = img.shape[:2]
        grid = [img[i:i + patch, j:j + patch]
                for i in range(0, height - patch + 1, patch)
                for j in range(0, width - patch + 1, patch)]
        keep = rng.choice(len(grid), min(per_class, len(grid)), replace=False)
        images += [rank_equalise(grid[k]) for k in sorted(keep)]
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
        if (summary.get('version') == DATASET_VERSION and summary.get('patch') == patch
                and summary.get('per_class') == per_class):
            return summary
        shutil.rmtree(osp.join(out, 'train'), ignore_errors=True)  # written by this function
        shutil.rmtree(osp.join(out, 'val'), ignore_errors=True)
    images, labels = texture_patches(patch, per_class, seed)
    splits = dict(zip(('train', 'val'), stratified_split(labels, 0.25, seed)))
    for split, indices in splits.items():
        for i in indices:
            folder = osp.join(out, split, SOURCES[labels[i]])
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(images[i]).save(osp.join(folder, f'{i:05d}.png'))
    summary = dict(version=DATASET_VERSION, classes=list(SOURCES), patch=patch,
                   per_class=per_class, seed=seed, train=len(splits['train']),
                   val=len(splits['val']))
    with open(stamp, 'w') as f:
        json.dump(summary, f, indent=2)
    return summary
