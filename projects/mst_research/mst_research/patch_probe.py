"""A frozen patch-feature probe: a linear classifier on each patch token, scored as mIoU.

The probe of DINOv2 and iBOT's linear segmentation, at the scale of one object per image: the
frozen last-layer patch tokens (:func:`embed_patches`), or each patch's raw pixels
(:func:`pixel_patches`, the baseline every learned feature must beat), are labelled
background (0) or the image's class (its folder's index + 1) from the object's pixel mask
(:func:`patch_labels`, :func:`pixel_labels`); one linear layer shared by all patches (a 1 x 1
convolution) is trained by cross-entropy on the training images' patches
(:func:`train_patch_probe`, full-batch L-BFGS by default) and scored as mIoU over background
and the classes (:func:`mean_iou`), at the patch grid and at the pixels
(:func:`predict_pixels`). :func:`patch_probe_miou` does it on features already computed,
:func:`probe_patches` on the object images of :func:`masked_splits` (the masks that
``write_object_images`` stores beside them): the test folder, or with ``validation`` the
validation images carved from the training folder, so that the probe's settings are chosen
without reading the test images.
"""
import math
import os.path as osp
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from mst_mm.models.algorithms.feature_embedder import forward_normalised

from .data import image_batches, load_class_folders, load_object_masks, validation_split
from .recipes import load_backbone

OPTIMIZERS = ('adamw', 'sgd', 'lbfgs')
NORMALIZATIONS = ('standardize', 'none')
# The defaults of train_patch_probe, also written with every result: chosen on the validation
# split with DINO's 50-epoch seed-0 teacher among 12 candidates (docs/evidence.md, "Patch
# features"; docs/results/patch_probe_50e/validation/). L-BFGS, as linear_probe_top1: full
# batch and deterministic, it runs close to the optimum, so the score depends on the features
# more than on where a schedule stops. No weight decay; 300 iterations, as 1,000 gained 0.01
# points at three times the time.
DEFAULT_SETTINGS = dict(optimizer='lbfgs', epochs=300, lr=None, weight_decay=0.0,
                        batch_size=1024, normalize='standardize', seed=0)
# lr=None: the optimiser's own (L-BFGS's unit step, with its line search).
DEFAULT_LR = dict(lbfgs=1.0, adamw=1e-2, sgd=0.1)


def load_frozen_backbone(backbone_cfg: dict, checkpoint: Optional[str],
                         weights: str = 'teacher') -> nn.Module:
    """The config's MST ViT without the [MASK] embedding, in eval mode, with the backbone
    that `mst_mm.converters.backbone_state` finds in ``checkpoint`` (None: random)."""
    return load_backbone(dict(backbone_cfg, use_mask_token=False), checkpoint, weights)


@torch.no_grad()
def embed_patches(backbone: nn.Module, batches, mean: Sequence[float],
                  std: Sequence[float]) -> torch.Tensor:
    """The final-normed last-layer patch tokens (N, C, h, w) of (B, 3, H, W) image batches,
    normalised as ``mst_mm``'s ``embed_images`` does, with ``forward_mst(...,
    with_patches=True)`` (no [MASK]: the frozen features)."""
    return torch.cat([out.feat_map.cpu() for out in forward_normalised(
        backbone, batches, mean, std, with_patches=True)])


def patch_labels(masks: torch.Tensor, classes: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(N, H, W) bool object masks and (N,) classes in 1..K -> (N, H/p, W/p) patch labels:
    the image's class where at least half of a patch's p^2 pixels are object, else background,
    0 (the rule by which ``mst_research.probes.patch_object_mask`` counts the object patches
    of the guidance shares)."""
    if masks.dim() != 3 or classes.shape != masks.shape[:1]:
        raise ValueError(f'masks must be (N, H, W) and classes (N,), got '
                         f'{tuple(masks.shape)} and {tuple(classes.shape)}.')
    _check_divisible(masks.shape[-2:], patch_size)
    cover = F.avg_pool2d(masks[:, None].float(), patch_size)[:, 0]  # (N, h, w) in [0, 1]
    return (cover >= 0.5).long() * classes.long()[:, None, None]


def pixel_labels(masks: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    r"""(N, H, W) bool masks and (N,) classes -> (N, H, W) labels
    :math:`y_n(u, v) = c_n \, m_n(u, v)`."""
    return masks.long() * classes.long()[:, None, None]


def _check_divisible(size: Sequence[int], patch_size: int) -> None:
    if any(s % patch_size for s in size):
        raise ValueError(f'The image size {tuple(size)} is not a multiple of the patch size '
                         f'{patch_size}: patches would straddle the border.')


def pixel_patches(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(N, 3, H, W) images -> (N, 3 p^2, H/p, W/p) float: each patch's pixels, flattened
    channel by channel and row by row, as its feature (the raw-pixels row)."""
    n, c, h, w = images.shape
    _check_divisible((h, w), patch_size)
    cols = F.unfold(images.float(), patch_size, stride=patch_size)  # (N, C p^2, h w)
    return cols.reshape(n, c * patch_size ** 2, h // patch_size, w // patch_size)


class PatchProbe(nn.Module):
    r"""A 1 x 1 linear layer on frozen (N, C, h, w) feature maps:
    :math:`s_{ij} = W \, (f_{ij} - \mu) / \sigma + b`, scores (N, K, h, w); :math:`\mu,
    \sigma` are fixed buffers (the training patches' statistics, or 0 and 1)."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(channels, num_classes)
        self.register_buffer('mean', torch.zeros(channels))
        self.register_buffer('std', torch.ones(channels))

    def classify(self, tokens: torch.Tensor) -> torch.Tensor:
        """(M, C) tokens -> (M, K) scores."""
        return self.linear((tokens - self.mean) / self.std)

    def forward(self, feat_map: torch.Tensor) -> torch.Tensor:
        return self.classify(feat_map.movedim(1, -1)).movedim(-1, 1)


def _tokens(feat_map: torch.Tensor) -> torch.Tensor:
    """(N, C, h, w) -> (N h w, C), patches in the order that (N, h, w) labels flatten."""
    return feat_map.movedim(1, -1).reshape(-1, feat_map.shape[1]).float()


def train_patch_probe(feats: torch.Tensor, labels: torch.Tensor, num_classes: int,
                      optimizer: str = 'lbfgs', epochs: int = 300, lr: Optional[float] = None,
                      weight_decay: float = 0.0, batch_size: int = 1024,
                      normalize: str = 'standardize', seed: int = 0) -> PatchProbe:
    """A :class:`PatchProbe` fit to (N, C, h, w) frozen features and (N, h, w) labels: the
    mean cross-entropy over the training patches, plus ``weight_decay`` * ||W||^2 (``lbfgs``;
    for ``adamw`` and ``sgd`` the optimiser's weight decay, on W and b). An epoch is one
    full-batch L-BFGS iteration (``lbfgs``, ``lr`` its step) or one pass over the patches in
    shuffled minibatches of ``batch_size`` with a cosine-decayed ``lr`` (``adamw``; ``sgd``
    with momentum 0.9, as DINO's linear probe); ``lr=None`` takes ``DEFAULT_LR[optimizer]``.
    ``normalize='standardize'`` fixes the training patches' per-channel mean and std (a
    frozen BatchNorm); ``'none'`` keeps the features. Seeded by ``seed`` (initialisation and
    order), so a rerun gives the same probe."""
    if optimizer not in OPTIMIZERS or normalize not in NORMALIZATIONS:
        raise ValueError(f'optimizer must be one of {OPTIMIZERS} and normalize one of '
                         f'{NORMALIZATIONS}, got {optimizer!r} and {normalize!r}.')
    if feats.shape[0] != labels.shape[0] or feats.shape[2:] != labels.shape[1:]:
        raise ValueError(f'feats (N, C, h, w) {tuple(feats.shape)} and labels (N, h, w) '
                         f'{tuple(labels.shape)} do not match.')
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    x, y = _tokens(feats), labels.reshape(-1).long()
    generator = torch.Generator().manual_seed(seed)
    probe = PatchProbe(x.shape[1], num_classes)
    with torch.no_grad():
        # nn.init.normal_'s own call; its generator= argument needs torch 2.2
        probe.linear.weight.normal_(0.0, 0.01, generator=generator)
        nn.init.zeros_(probe.linear.bias)
        if normalize == 'standardize':
            probe.mean.copy_(x.mean(0))
            probe.std.copy_(x.std(0) + 1e-6)   # constant channels (a flat pixel) stay finite
    params = list(probe.linear.parameters())
    if optimizer == 'lbfgs':
        minimise_lbfgs(params, lambda: F.cross_entropy(probe.classify(x), y)
                       + weight_decay * probe.linear.weight.pow(2).sum(), epochs, lr)
    else:
        with torch.enable_grad():
            _fit_minibatch(probe, x, y, params, optimizer, epochs, lr, weight_decay,
                           batch_size, generator)
    return probe.eval()


def minimise_lbfgs(params: List[torch.Tensor], loss: Callable[[], torch.Tensor],
                   iterations: int, lr: float = 1.0) -> None:
    """Full-batch L-BFGS on ``loss()`` (history 20, strong Wolfe line search): no schedule to
    tune, and deterministic, so a probe's score depends only on the features."""
    solver = torch.optim.LBFGS(params, lr=lr, max_iter=iterations, history_size=20,
                               line_search_fn='strong_wolfe')

    def closure() -> torch.Tensor:
        solver.zero_grad()
        value = loss()
        value.backward()
        return value

    with torch.enable_grad():
        solver.step(closure)


def _fit_minibatch(probe: PatchProbe, x: torch.Tensor, y: torch.Tensor,
                   params: List[torch.Tensor], optimizer: str, epochs: int, lr: float,
                   weight_decay: float, batch_size: int, generator: torch.Generator) -> None:
    if optimizer == 'adamw':
        solver = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    else:
        solver = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(x) / batch_size)
    # Cosine to 0: the last iterate averages out minibatch noise, so the score depends on
    # the features more than on where the schedule stops.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(solver, epochs * steps_per_epoch)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            batch = order[start:start + batch_size]
            loss = F.cross_entropy(probe.classify(x[batch]), y[batch])
            solver.zero_grad()
            loss.backward()
            solver.step()
            schedule.step()


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(K, K) int64 counts, rows the true class, columns the predicted one."""
    index = target.reshape(-1).long() * num_classes + pred.reshape(-1).long()
    return torch.bincount(index, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def mean_iou(confusion: torch.Tensor) -> Tuple[float, List[Optional[float]]]:
    """mIoU (%) and the per-class IoU, TP / (TP + FP + FN), of a confusion matrix pooled over
    the whole set. A class absent from both the truth and the prediction (0 / 0) is left out
    of the mean and its IoU is None (as mmseg's ``IoUMetric`` does with nanmean); a class
    present in only one of them counts, with IoU 0."""
    confusion = confusion.double()
    tp = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - tp   # TP + FP + FN
    present = union > 0
    iou = tp / union.clamp(min=1)
    per_class = [float(v) if p else None for v, p in zip(iou, present)]
    return float(iou[present].mean() * 100) if present.any() else float('nan'), per_class


@torch.no_grad()
def predict_pixels(scores: torch.Tensor, image_size: Tuple[int, int]) -> torch.Tensor:
    r"""(N, K, h, w) patch scores -> (N, H, W) pixel classes:
    :math:`\hat y(u) = \arg\max_k \sum_{ij} \beta_{ij}(u) \, s_{ij,k}`, with
    :math:`\beta` the bilinear weights of the patch centres (``align_corners=False``)."""
    return F.interpolate(scores, size=tuple(image_size), mode='bilinear',
                         align_corners=False).argmax(1)


@torch.no_grad()
def evaluate_patch_probe(probe: PatchProbe, feats: torch.Tensor, patch_target: torch.Tensor,
                         pixel_target: torch.Tensor, batch_size: int = 500) -> Dict[str, object]:
    """mIoU (%) and per-class IoU of ``probe`` on (N, C, h, w) features against (N, h, w)
    patch labels and (N, H, W) pixel labels, at the patch grid and at the pixels."""
    num_classes = probe.linear.out_features
    patch_conf = torch.zeros(num_classes, num_classes, dtype=torch.long)
    pixel_conf = torch.zeros_like(patch_conf)
    # In batches: the upsampled scores of 2,000 32 x 32 images would be 90 MB at once.
    for start in range(0, len(feats), batch_size):
        scores = probe(feats[start:start + batch_size].float())
        patch_conf += confusion_matrix(scores.argmax(1), patch_target[start:start + batch_size],
                                       num_classes)
        pixels = pixel_target[start:start + batch_size]
        pixel_conf += confusion_matrix(predict_pixels(scores, pixels.shape[-2:]), pixels,
                                       num_classes)
    patch_miou, patch_iou = mean_iou(patch_conf)
    pixel_miou, pixel_iou = mean_iou(pixel_conf)
    return dict(patch_miou=patch_miou, pixel_miou=pixel_miou, patch_iou=patch_iou,
                pixel_iou=pixel_iou)


def probe_settings(**settings) -> dict:
    """Every setting of :func:`train_patch_probe` as a result records it: the defaults with
    ``settings`` in place, and the optimiser's own lr for ``lr=None``."""
    unknown = set(settings) - set(DEFAULT_SETTINGS)
    if unknown:
        raise TypeError(f'unknown probe settings {sorted(unknown)}; the settings are '
                        f'{sorted(DEFAULT_SETTINGS)}.')
    settings = dict(DEFAULT_SETTINGS, **settings)
    if settings['lr'] is None:   # an unknown optimiser is refused by train_patch_probe
        settings['lr'] = DEFAULT_LR.get(settings['optimizer'])
    return settings


def patch_probe_miou(train_feats: torch.Tensor, train_masks: torch.Tensor,
                     train_classes: torch.Tensor, test_feats: torch.Tensor,
                     test_masks: torch.Tensor, test_classes: torch.Tensor,
                     num_classes: Optional[int] = None, **settings) -> Dict[str, object]:
    """Train the probe (:func:`train_patch_probe` with ``settings``, its defaults otherwise)
    on one set of images and score it on another (the test images, or a validation split
    carved from the training images when choosing ``settings``): (N, C, h, w) frozen features
    (the patch size is H / h), (N, H, W) bool object masks and (N,) classes in 1..K;
    ``num_classes`` K + 1 (default: 1 + the largest class seen). Returns ``patch_miou`` and
    ``pixel_miou`` (%), per-class ``patch_iou`` and ``pixel_iou`` (None for a class absent
    from truth and prediction), ``num_classes``, ``patch_size``, the object share of the test
    patches and the settings used."""
    settings = probe_settings(**settings)
    patch_size = train_masks.shape[-1] // train_feats.shape[-1]
    if test_masks.shape[-1] // test_feats.shape[-1] != patch_size:
        raise ValueError('The train and test features have different patch sizes.')
    if num_classes is None:
        num_classes = int(max(train_classes.max(), test_classes.max())) + 1
    train_target = patch_labels(train_masks, train_classes, patch_size)
    test_target = patch_labels(test_masks, test_classes, patch_size)
    probe = train_patch_probe(train_feats, train_target, num_classes, **settings)
    result = evaluate_patch_probe(probe, test_feats, test_target,
                                  pixel_labels(test_masks, test_classes))
    return dict(result, num_classes=num_classes, patch_size=patch_size,
                object_patch_share=float((test_target > 0).float().mean()), settings=settings)


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
                                'images (python '
                                'projects/mst_research/tools/write_animal_shapes.py DIR).')
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


def probe_patches(train: MaskedImages, test: MaskedImages, backbone: Optional[nn.Module] = None,
                  mean: Sequence[float] = (), std: Sequence[float] = (),
                  patch_size: Optional[int] = None, **settings) -> Dict[str, object]:
    """Patch-grid and pixel mIoU (%) of the probe trained on ``train``'s patches and scored
    on ``test``'s, over background and the classes of either set (11 on the animal images).
    The features are the backbone's last-layer patch tokens, the images normalised by
    ``mean`` and ``std`` as in training, or with ``backbone=None`` the raw pixels of
    ``patch_size`` patches."""
    if backbone is None and patch_size is None:
        raise ValueError('The raw-pixels features need a patch_size.')

    def features(data: MaskedImages) -> torch.Tensor:
        if backbone is None:
            return pixel_patches(torch.from_numpy(data.images).permute(0, 3, 1, 2), patch_size)
        return embed_patches(backbone, image_batches(data.images), mean, std)

    return patch_probe_miou(features(train), train.masks, train.classes, features(test),
                            test.masks, test.classes, **settings)
