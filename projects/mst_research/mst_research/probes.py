r"""The held-out evaluations of one backbone (:class:`Probe`): weighted k-NN (the plugin's), a
linear probe, the frozen patch probe, and where the teacher's attention and the guided mask
fall against the objects' masks.

The paper motivates the attention-guided mask (Sec. 3.2) by the teacher's CLS attention:
patches it attends least are background, so masking them spares the object. The objects'
pixel masks measure it (a patch counts as object when at least half of its pixels are):

- ``attention_on_object_share``: the CLS attention mass on object patches,
  :math:`\sum_{i \in O} Attn_i / \sum_i Attn_i`, averaged over images;
- ``candidates_on_object_share``: of the ``N // num`` lowest-attention patches (the mask
  candidates of Eq. 6), the share on the object, pooled over images;
- ``masked_on_object_share``: the same for the patches that Eq. 6 masks with probability
  ``p`` (one fixed draw);
- ``object_area_share``: object patches / all patches, averaged over images: the level that
  every share above takes when the attention carries no information about the object.
"""
import math
import os.path as osp
from typing import Dict

import torch
import torch.nn.functional as F

from mst_mm.evaluation import knn_top1
from mst_mm.models.algorithms.feature_embedder import embed_images
from mst_mm.models.utils import attention_mask

from .data import image_batches
from .patch_probe import masked_splits, minimise_lbfgs, patch_labels, probe_patches
from .recipes import KNN_K, NUM, P


def patch_object_mask(pixel_masks: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, H, W) bool pixel masks -> (B, N) bool, True where >= half a patch is object (the
    patch probe's rule, :func:`patch_labels`); patches numbered row by row, as the ViT's
    tokens are."""
    if pixel_masks.dim() != 3:
        raise ValueError(f'pixel_masks must be (B, H, W), got {tuple(pixel_masks.shape)}.')
    return patch_labels(pixel_masks, torch.ones(len(pixel_masks)), patch_size).flatten(1) > 0


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


def linear_probe_top1(train_feats: torch.Tensor, train_labels: torch.Tensor,
                      test_feats: torch.Tensor, test_labels: torch.Tensor,
                      weight_decay: float = 1e-3, steps: int = 200) -> float:
    r"""Top-1 (%) of a softmax classifier trained on frozen features, tested on others.

    The features are standardised with the train statistics, then
    :math:`\min_{W,b} \mathrm{CE}(W x + b, y) + \lambda \|W\|^2` is solved by L-BFGS over
    the whole train set (:func:`minimise_lbfgs`): the CPU-scale counterpart of the
    config-based probe (``configs/benchmarks/classification``), which trains through
    augmentations for 100 epochs.
    """
    mean, std = train_feats.float().mean(0), train_feats.float().std(0) + 1e-6
    x_train = (train_feats.float() - mean) / std
    x_test = (test_feats.float() - mean) / std
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    linear = torch.nn.Linear(x_train.shape[1], num_classes)
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    minimise_lbfgs(list(linear.parameters()), lambda: F.cross_entropy(
        linear(x_train), train_labels.long()) + weight_decay * linear.weight.pow(2).sum(), steps)
    with torch.no_grad():
        predicted = linear(x_test).argmax(1)
    return float((predicted == test_labels.long()).float().mean() * 100)


class Probe:
    """The held-out evaluations of one backbone: k-NN, linear probe, frozen patch probe and
    guidance shares."""

    def __init__(self, data_root: str, validation: bool = False, patch_size: int = 4) -> None:
        """The train images against the test images; with ``validation``, the fitting
        images against the validation images carved from the train images (the test
        images are not read). ``patch_size``: the raw-pixels row's patches (the ViT's)."""
        self.train, self.test = masked_splits(osp.join(data_root, 'objects'), validation)
        self.train_images, self.train_labels = self.train.images, self.train.classes - 1
        self.test_images, self.test_labels = self.test.images, self.test.classes - 1
        self.test_masks = self.test.masks
        self.patch_size = patch_size

    def classify(self, train_feats: torch.Tensor, test_feats: torch.Tensor) -> dict:
        """k-NN and linear-probe top-1 (%) of the test images' features."""
        return dict(knn_top1=knn_top1(train_feats, self.train_labels, test_feats,
                                      self.test_labels, ks=(KNN_K, ))[KNN_K],
                    linear_top1=linear_probe_top1(train_feats, self.train_labels, test_feats,
                                                  self.test_labels))

    def raw_pixels(self) -> dict:
        return dict(self.classify(torch.from_numpy(self.train_images).flatten(1).float(),
                                  torch.from_numpy(self.test_images).flatten(1).float()),
                    **self.patches())

    def patches(self, backbone=None, mean=(), std=()) -> dict:
        """The frozen patch probe (``mst_research.patch_probe``, its default settings) of the
        backbone's last-layer patch tokens, or of each patch's raw pixels with
        ``backbone=None``: mIoU (%) over background and the classes, at the patch grid and at
        the pixels."""
        result = probe_patches(self.train, self.test, backbone, mean, std,
                               patch_size=self.patch_size)
        return dict(patch_probe_miou=result['patch_miou'],
                    patch_probe_pixel_miou=result['pixel_miou'])

    def model(self, model, classify: bool = True) -> dict:
        """The EMA teacher's backbone of an MST model."""
        return self.backbone(*teacher_of(model), classify)

    def backbone(self, backbone, mean, std, classify: bool = True) -> dict:
        test_feats, attn = embed_images(backbone, image_batches(self.test_images), mean, std,
                                        with_attn=True)
        patch = self.test_masks.shape[-1] // int(math.isqrt(attn.shape[1]))
        result = guidance_shares(attn, patch_object_mask(self.test_masks, patch), NUM, P)
        if classify:
            train_feats, _ = embed_images(backbone, image_batches(self.train_images), mean, std)
            result.update(self.classify(train_feats, test_feats))
            result.update(self.patches(backbone, mean, std))
        return result

    def complete(self, load):
        """For :meth:`Store.get`: the patch probe of a row stored without it, its backbone
        ``load(row['checkpoint'])`` as (backbone, mean, std) (None: the raw pixels)."""
        def missing(row: dict) -> dict:
            if 'patch_probe_miou' in row:
                return {}
            return self.patches(*load(row['checkpoint'])) if load else self.patches()
        return missing


def teacher_of(model) -> tuple:
    """(the EMA teacher's backbone, mean, std) of an MST model."""
    return (model.teacher.module[0], model.data_preprocessor.mean,
            model.data_preprocessor.std)
