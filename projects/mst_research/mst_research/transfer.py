"""The evidence run's transfer leg: Mask R-CNN (mmdet) or SETR (mmseg) fine-tuned in this
process on the scenes of :func:`mst_research.data.write_scenes`, from an MST
checkpoint converted as ``tools/model_converters/mst2downstream.py`` does, or from random init.
"""
import copy
import logging
import os
import os.path as osp
import time
from typing import Dict, Optional

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import DefaultScope
from mmengine.runner import Runner
from mmpretrain.utils import get_ori_model

from mst_mm.converters import convert_for_downstream
from mst_mm.errors import CheckpointError

from .recipes import scale_schedulers

# The metrics that finetune returns, by target: {returned name: evaluator's name}.
TRANSFER_METRICS = {
    'mmdet': {'bbox_mAP': 'coco/bbox_mAP', 'segm_mAP': 'coco/segm_mAP'},
    'mmseg': {'mIoU': 'mIoU'},
}


class PretrainedBackboneCheck(Hook):
    """Refuse to train unless every converted tensor is in the backbone after init: mmdet's
    Swin and mmseg's ViT load ``init_cfg=dict(type='Pretrained')`` with ``strict=False`` and
    report nothing."""
    priority = 'VERY_HIGH'

    def __init__(self, converted: Dict[str, torch.Tensor], source: str) -> None:
        self.converted = converted
        self.source = source

    def before_train(self, runner) -> None:
        model = get_ori_model(runner.model)
        state = model.backbone.state_dict()
        missing = sorted(k for k in self.converted if k not in state)
        different = sorted(k for k in self.converted if k in state and not torch.equal(
            state[k].detach().cpu(), self.converted[k].detach().cpu()))
        if missing or different:
            shown = ', '.join((missing + different)[:8])
            raise CheckpointError(
                f'{self.source} did not load into the {type(model.backbone).__name__}: '
                f'{len(missing)} converted tensors have no place in it and {len(different)} '
                f'differ from it after initialisation ({shown}). The backbone would be '
                'fine-tuned from (partly) random weights.')
        print_log(f'All {len(self.converted)} converted tensors are in the backbone after '
                  f'init ({self.source}).', logger='current')


class FrozenBackbone(Hook):
    """Keeps the backbone as initialised while the neck and heads train: its parameters stop
    requiring grad before the first backward (the optimizer holds them, but AdamW and SGD skip
    a parameter whose grad is None, weight decay included), and it is put in eval mode (no
    drop path, no dropout) before every iteration, as ``IterBasedTrainLoop`` calls
    ``model.train()`` each time. Not for ``MMDistributedDataParallel`` without
    ``find_unused_parameters``. (``paramwise_cfg`` with ``lr_mult=0`` on ``'backbone'`` would
    still compute the backbone's grads, and lose to the configs' longer custom keys, e.g.
    ``pos_embed``, whose parameters would go on training.)"""

    def before_train(self, runner) -> None:
        backbone = get_ori_model(runner.model).backbone
        backbone.requires_grad_(False)
        print_log(f'Frozen backbone: the {sum(p.numel() for p in backbone.parameters())} '
                  f'parameters of the {type(backbone).__name__} stay as initialised and it '
                  'runs in eval mode; only the neck and heads train.', logger='current')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        get_ori_model(runner.model).backbone.eval()


class LastValMetrics(Hook):
    """Keeps the metrics of the last validation (the one at the end of training)."""
    priority = 'LOWEST'

    def __init__(self) -> None:
        self.metrics: Optional[dict] = None

    def after_val_epoch(self, runner, metrics: Optional[dict] = None) -> None:
        self.metrics = dict(metrics or {})


def _fit_schedule(cfg: Config, old_max_iters: int) -> None:
    """Scale the iteration-based schedulers' begin / end to a changed ``max_iters``."""
    new_max_iters = cfg.train_cfg.max_iters
    if new_max_iters == old_max_iters:
        return
    scale_schedulers(cfg, new_max_iters / old_max_iters, by_epoch=False)
    checkpoint = cfg.get('default_hooks', {}).get('checkpoint')
    if checkpoint is not None and checkpoint.get('interval', 0) == old_max_iters:
        checkpoint.interval = new_max_iters


def _point_at_scenes(cfg: Config, scenes_root: str) -> None:
    """Every dataset's ``data_root`` and every evaluator's ``ann_file`` under ``scenes_root``."""
    old_root = cfg.get('data_root')
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if loader:
            loader.dataset.data_root = scenes_root
        evaluator = cfg.get(f'{split}_evaluator')
        for metric in (evaluator if isinstance(evaluator, list) else [evaluator]):
            if metric and metric.get('ann_file'):
                name = metric.ann_file
                if old_root and name.startswith(old_root):
                    name = name[len(old_root):].lstrip('/')
                metric.ann_file = osp.join(scenes_root, name)
    cfg.data_root = scenes_root


def finetune(config_path: str, checkpoint: Optional[str], work_dir: str, scenes_root: str,
             seed: int, target: str, options: Optional[dict] = None,
             frozen_backbone: bool = False) -> Dict[str, float]:
    """Fine-tune ``config_path`` on ``scenes_root`` from ``checkpoint``'s EMA teacher backbone
    (None: random init) with ``randomness=dict(seed=seed)``, and validate at the end. With
    ``frozen_backbone`` only the neck and heads train (:class:`FrozenBackbone`): the metrics
    then show what the features themselves carry, which full fine-tuning can make up for or
    wash out. ``options`` are merged into the config; a changed ``train_cfg.max_iters``
    rescales the iteration-based schedulers. Returns plain floats: ``'mmdet'``: ``bbox_mAP``
    and ``segm_mAP`` (0-1, as ``CocoMetric`` prints them; 0.0 when nothing was detected);
    ``'mmseg'``: ``mIoU`` (%, background included)."""
    if target not in TRANSFER_METRICS:
        raise ValueError(f'target must be one of {sorted(TRANSFER_METRICS)}, got {target!r}.')
    if not osp.isdir(osp.join(scenes_root, 'train')) or not osp.isdir(
            osp.join(scenes_root, 'val')):
        raise FileNotFoundError(
            f'{scenes_root} has no train/ and val/ scenes: write them with '
            f'python projects/mst_research/tools/write_animal_shapes.py {osp.dirname(scenes_root)}')
    cfg = Config.fromfile(config_path)
    old_max_iters = cfg.train_cfg.max_iters
    if options:
        cfg.merge_from_dict(copy.deepcopy(options))
        if 'param_scheduler' not in options:
            _fit_schedule(cfg, old_max_iters)
    _point_at_scenes(cfg, scenes_root)
    cfg.work_dir = work_dir
    cfg.randomness = dict(cfg.get('randomness') or {}, seed=seed)  # keeps diff_rank_seed
    cfg.launcher = 'none'
    if cfg.get('visualizer'):
        # mmengine hands out an existing visualizer of the same name, with the vis backends
        # (and log folder) of an earlier fine-tune in this process: one name per run.
        cfg.visualizer.name = f'transfer_{osp.abspath(work_dir)}_{time.time_ns()}'
    os.makedirs(work_dir, exist_ok=True)

    hooks = [LastValMetrics()]
    if frozen_backbone:
        hooks.append(FrozenBackbone())
    if checkpoint is None:
        cfg.model.backbone.init_cfg = None
    else:
        converted_path = osp.join(work_dir, f'{target}_backbone.pth')
        converted = convert_for_downstream(
            checkpoint, converted_path, target, cfg,
            log=lambda line: print_log(line, logger='current'))
        cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=converted_path)
        hooks.append(PretrainedBackboneCheck(converted, converted_path))

    current = DefaultScope.get_current_instance()
    # The runner makes mmdet's or mmseg's scope the current one; the caller's comes back.
    with DefaultScope.overwrite_default_scope(current.scope_name if current else None):
        runner = Runner.from_cfg(cfg)
        for hook in hooks:
            runner.register_hook(hook)
        runner.train()
    metrics = hooks[0].metrics
    if metrics is None:
        raise RuntimeError(f'{config_path} ran no validation: set val_cfg, val_dataloader and '
                           'val_evaluator.')
    result = {}
    for name, key in TRANSFER_METRICS[target].items():
        if key in metrics:
            result[name] = float(metrics[key])
        elif target == 'mmdet' and not any(k.startswith('coco/') for k in metrics):
            # CocoMetric returns no AP when the model detected nothing in the whole val set.
            print_log(f'No detections on the val scenes: {name} is 0.', logger='current',
                      level=logging.WARNING)
            result[name] = 0.0
        else:
            raise KeyError(f'The validation of {config_path} reported {sorted(metrics)}, '
                           f'not {key!r}.')
    return result
