"""The multi-crop views of a pretraining config, as the model sees them in training, laid out
as one picture (``tools/analysis/browse_dataset.py``).

A config makes its views in one of three ways: whole views in the data workers
(``MultiCrop``), crops in the workers and the rest in the model's data preprocessor
(``MultiCrop(crops_only=True)`` + ``BatchViewAugment``), or everything in the preprocessor
(``BatchMultiCrop``). Looking only at the dataset's output would show unaugmented crops, or
whole images, for the last two; so the first images go through the dataset, the config's
collate function and the model's data preprocessor in training mode, as in a training step,
and the normalisation is undone for display.
"""
import copy
from functools import partial
from typing import List, Optional

import numpy as np
import torch
from mmengine.config import Config
from mmengine.registry import FUNCTIONS, DefaultScope
from mmengine.runner import set_random_seed
from mmpretrain.registry import DATASETS, MODELS

from ..errors import UserInputError


def _build_collate(dataloader_cfg: dict):
    """The collate function as mmengine's ``Runner.build_dataloader`` builds it (its default:
    ``pseudo_collate``)."""
    collate_cfg = copy.deepcopy(dataloader_cfg.get('collate_fn', dict(type='pseudo_collate')))
    collate_type = collate_cfg.pop('type')
    if isinstance(collate_type, str):
        collate_type = FUNCTIONS.get(collate_type)
    return partial(collate_type, **collate_cfg)


def multicrop_views(cfg: Config, num_images: int = 4, seed: Optional[int] = 0
                    ) -> List[np.ndarray]:
    """The training views of the first ``num_images`` images of ``cfg``'s training dataset.

    Args:
        cfg (Config): A pretraining config (``train_dataloader`` and ``model``).
        num_images (int): How many images, from the dataset's start (a broken image is
            replaced by another, as in training).
        seed (int, optional): Seeds Python's, numpy's and torch's global generators first
            (the workers' and the preprocessor's draws), so a picture can be made again;
            None leaves them as they are.

    Returns:
        list[np.ndarray]: One (num_images, h, w, 3) uint8 RGB array per view, in the order
        the model receives them (the global views first).
    """
    if num_images < 1:
        raise UserInputError(f'num_images must be at least 1, got {num_images}.')
    loader_cfg = cfg.get('train_dataloader')
    if not loader_cfg or not loader_cfg.get('dataset'):
        raise UserInputError('The config has no train_dataloader.dataset: browse_dataset shows '
                             "a pretraining config's training views.")
    if seed is not None:
        set_random_seed(seed)
    # The pipelines' transforms (mmcv's, mmpretrain's, ours) resolve in the config's scope.
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmpretrain')):
        try:
            dataset = DATASETS.build(copy.deepcopy(loader_cfg['dataset']))
        except (FileNotFoundError, RuntimeError) as error:
            # The datasets' start-up checks name the folder and the fix: one message, no trace.
            raise UserInputError(str(error)) from error
        if len(dataset) < num_images:
            raise UserInputError(f'The dataset holds {len(dataset)} images, fewer than the '
                                 f'{num_images} asked for.')
        batch = _build_collate(loader_cfg)([dataset[i] for i in range(num_images)])
        model_cfg = cfg.get('model') or {}
        # BaseSelfSupervisor's default, which MST inherits.
        pre_cfg = copy.deepcopy(dict(model_cfg.get('data_preprocessor') or {}))
        pre_cfg.setdefault('type', 'SelfSupDataPreprocessor')
        preprocessor = MODELS.build(pre_cfg)
    # The CPU is enough for a few images; training=True runs the batched augmentations.
    with torch.no_grad():
        inputs = preprocessor(batch, training=True)['inputs']
    views = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    return [_to_display(view, preprocessor) for view in views]


def _to_display(view: torch.Tensor, preprocessor) -> np.ndarray:
    """(B, 3, h, w) normalised -> (B, h, w, 3) uint8 RGB: the preprocessor's mean and std
    undone, in its output channel order (RGB after ``to_rgb``; the images are decoded as
    mmcv's BGR, which stays BGR without it)."""
    view = view.float().cpu()
    if getattr(preprocessor, '_enable_normalize', False):
        view = view * preprocessor.std.cpu() + preprocessor.mean.cpu()
    if not getattr(preprocessor, '_channel_conversion', False):
        view = view.flip(1)
    return view.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def views_grid(views: List[np.ndarray], zoom: int = 1, pad: int = 2,
               background: int = 255) -> np.ndarray:
    """One row per image, its views left to right at their own pixel size (a local view is
    drawn smaller than a global one, as the model gets it), top-aligned in cells as tall as
    the largest view, ``pad`` pixels apart and around.

    Args:
        views (list[np.ndarray]): :func:`multicrop_views`'s arrays, (N, h, w, 3) each.
        zoom (int): Nearest-neighbour magnification of every view (32-px views are hard to
            see at 1).
        pad (int): Pixels between cells and around the picture.
        background (int): The grey level between the views.

    Returns:
        np.ndarray: (H, W, 3) uint8 RGB, with H = N * max(h) * zoom + (N + 1) * pad and
        W = sum(w) * zoom + (len(views) + 1) * pad.
    """
    if not views:
        raise ValueError('views_grid needs at least one view.')
    if zoom < 1:
        raise ValueError(f'zoom must be a positive integer, got {zoom}.')
    rows = views[0].shape[0]
    views = [v.repeat(zoom, axis=1).repeat(zoom, axis=2) for v in views]
    cell_h = max(v.shape[1] for v in views)
    height = rows * cell_h + (rows + 1) * pad
    width = sum(v.shape[2] for v in views) + (len(views) + 1) * pad
    grid = np.full((height, width, 3), background, dtype=np.uint8)
    left = pad
    for view in views:
        h, w = view.shape[1:3]
        for row in range(rows):
            top = pad + row * (cell_h + pad)
            grid[top:top + h, left:left + w] = view[row]
        left += w + pad
    return grid


def default_zoom(views: List[np.ndarray], min_size: int = 128) -> int:
    """The smallest whole magnification that draws the first (global) view at least
    ``min_size`` pixels tall: 1 for 224-px views, 4 for the 32-px evidence views."""
    return max(1, -(-min_size // views[0].shape[1]))
