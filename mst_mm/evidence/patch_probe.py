"""The frozen patch-feature probe (``mst_mm.evaluation.patch_probe``) on the object images:
``objects/{train,test}/<class>/*.png`` and the masks that ``write_object_images`` stores
beside them, ``objects/{train,test}_masks.npz``.

The image's class is its folder's index + 1 (0 is background); the test images are the test
folder, or, with ``validation``, the validation images carved from the training folder
(``animal_shapes.validation_split``, as ``tools/evidence.py --validation`` carves them),
so that the probe's settings can be chosen without reading the test images.
"""
import os.path as osp
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from ..evaluation.patch_probe import patch_probe_miou, pixel_patches
from ..models.algorithms.feature_embedder import embed_patches
from .animal_shapes import load_object_masks, validation_split
from .frozen_features import image_batches, load_class_folders


class MaskedImages(NamedTuple):
    """(N, H, W, 3) uint8 RGB images, (N,) classes in 1..K and (N, H, W) bool object masks."""
    images: np.ndarray
    classes: torch.Tensor
    masks: torch.Tensor

    def subset(self, indices: Sequence[int]) -> 'MaskedImages':
        indices = list(indices)
        return MaskedImages(self.images[indices], self.classes[indices], self.masks[indices])


def load_masked_images(objects_root: str, split: str = 'test') -> MaskedImages:
    """``objects_root/split/<class>/*.png`` in ``CustomDataset`` order, with their masks."""
    images, labels, paths = load_class_folders(osp.join(objects_root, split))
    if not osp.isfile(osp.join(objects_root, f'{split}_masks.npz')):
        raise FileNotFoundError(f'No {split}_masks.npz in {objects_root}: the probe needs the '
                                'object masks that write_object_images stores beside the '
                                'images (python tools/misc/write_animal_shapes.py DIR).')
    masks = load_object_masks(objects_root, split)
    missing = [p for p in paths if osp.join(split, p) not in masks]
    if missing:
        raise FileNotFoundError(f'{split}_masks.npz has no mask for {len(missing)} image(s) '
                                f'of {objects_root}/{split}, e.g. {missing[0]}.')
    stacked = torch.from_numpy(np.stack([masks[osp.join(split, p)] for p in paths]))
    return MaskedImages(images, labels + 1, stacked.bool())


def masked_splits(objects_root: str, validation: bool = False
                  ) -> Tuple[MaskedImages, MaskedImages]:
    """(train, test) images; with ``validation``, (fitting, validation) images of the
    training folder, 100 a class held out, and the test folder is not read."""
    train = load_masked_images(objects_root, 'train')
    if not validation:
        return train, load_masked_images(objects_root, 'test')
    fit, val = validation_split((train.classes - 1).numpy())
    return train.subset(fit), train.subset(val)


def patch_features(data: MaskedImages, backbone: Optional[nn.Module] = None,
                   mean: Sequence[float] = (), std: Sequence[float] = (),
                   patch_size: Optional[int] = None, batch_size: int = 500) -> torch.Tensor:
    """(N, C, h, w) features of the images: the backbone's last-layer patch tokens, normalised
    by ``mean`` and ``std`` as in training, or with ``backbone=None`` the raw pixels of
    ``patch_size`` patches."""
    if backbone is None:
        if patch_size is None:
            raise ValueError('The raw-pixels features need a patch_size.')
        return pixel_patches(torch.from_numpy(data.images).permute(0, 3, 1, 2), patch_size)
    return embed_patches(backbone, image_batches(data.images, batch_size), mean, std)


def probe_patches(train: MaskedImages, test: MaskedImages, backbone: Optional[nn.Module] = None,
                  mean: Sequence[float] = (), std: Sequence[float] = (),
                  patch_size: Optional[int] = None, **settings) -> Dict[str, object]:
    """Patch-grid and pixel mIoU (%) of the probe trained on ``train``'s patches and scored
    on ``test``'s, over background and the classes 1..K, K the largest class of either set
    (11 classes on the animal images); the features are :func:`patch_features`'s."""
    num_classes = int(max(train.classes.max(), test.classes.max())) + 1
    return patch_probe_miou(patch_features(train, backbone, mean, std, patch_size),
                            train.masks, train.classes,
                            patch_features(test, backbone, mean, std, patch_size),
                            test.masks, test.classes, num_classes=num_classes, **settings)
