"""The evidence run's recipes: its configs and variants (the paper's Table 4 rows), seeds and
epochs, the pretraining config of one row, and the supervised ceiling: the pretraining
config's ViT trained with the labels on the same images, then probed like the EMA teachers.
"""
import argparse
import copy
import logging
import os
import os.path as osp
from typing import List, Optional, Tuple, Union

import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmpretrain.registry import MODELS

from mst_mm.converters import backbone_state
from mst_mm.engine import build_runner, load_checked
from mst_mm.models import DINO_MODE

from . import REPO
from .data import class_folder_files, validation_split, write_object_images, write_scenes

VIT_CONFIG = osp.join(REPO, 'configs', 'mst', 'mst_vit-tiny-p4_1xb64-coslr-6e_animals.py')
KIT_CONFIGS = osp.join(REPO, 'projects', 'mst_research', 'configs')
SWIN_CONFIG = osp.join(KIT_CONFIGS, 'mst_swin-nano-p4-w4_1xb64-coslr-6e_animals.py')
DET_CONFIG = osp.join(KIT_CONFIGS, 'mask-rcnn_mst-swin-nano_fpn_animal-scenes.py')
SEG_CONFIG = osp.join(KIT_CONFIGS, 'setr_mst-vit-tiny_naive_animal-scenes.py')
DEFAULT_DATA_ROOT = 'data/animal_shapes'
KNN_K = 20
# The guided mask (Eq. 6): the 1 / NUM least attended patches are its candidates, each masked
# with probability P.
NUM, P = 8, 0.1
# name: model overrides of the pretraining config (the paper's Table 4 rows).
VARIANTS = {
    'dino': DINO_MODE,
    'mst_decoder': dict(mask_cfg=dict(mode='none')),
    # The same expected share of masked patches as the guided rule: p / num.
    'mst_random_mask': dict(mask_cfg=dict(mode='random', p=P / NUM)),
    'mst_guided_mask': dict(mask_cfg=dict(mode='attention', num=NUM, p=P)),
}
# The fine-tunes start from these rows' seed 0, into these frameworks.
TRANSFER_FROM = ('random_init', 'dino', 'mst_guided_mask')
TRANSFER_TARGETS = ('mmdet', 'mmseg')

SCHEDULES = {
    # seeds per variant, pretraining epochs (None: the config's), supervised seeds,
    # fine-tune seeds, fine-tune overrides
    'full': dict(seeds=dict(dino=3, mst_decoder=2, mst_random_mask=2, mst_guided_mask=3),
                 epochs=None, supervised_seeds=2, finetune_seeds=2, finetune=None),
    'quick': dict(seeds=dict(dino=1, mst_decoder=1, mst_random_mask=1, mst_guided_mask=1),
                  epochs=1, supervised_seeds=1, finetune_seeds=1, finetune='quick'),
}


def pretrain_config(base: str, variant: str, seed: int, schedule: dict, data_root: str,
                    work_dir: str, probe: bool = True) -> Config:
    """The pretraining config of one row: ``base`` with the variant's model and the
    schedule's recipe options (``cfg_options``, the ViT's only), the seed, the schedule's
    epochs, images (less the validation images with ``validation``) and batch."""
    cfg = Config.fromfile(base)
    cfg.merge_from_dict(dict(model=VARIANTS[variant]))  # nested dicts merge, None replaces
    if base != SWIN_CONFIG and schedule.get('cfg_options'):
        cfg.merge_from_dict(schedule['cfg_options'])
    objects = osp.join(data_root, 'objects')
    cfg.train_dataloader.dataset.data_root = objects
    if schedule.get('validation'):
        fit, val = split_indices(data_root, schedule)
        cfg.train_dataloader.dataset.indices = fit
    if schedule.get('batch_size'):
        cfg.train_dataloader.batch_size = schedule['batch_size']
    cfg.randomness = dict(cfg.get('randomness') or {}, seed=seed)  # keeps diff_rank_seed
    cfg.work_dir = work_dir
    _set_epochs(cfg, schedule['epochs'])
    # The config's k-NN probe (KNNProbeHook): this data root's train images against its
    # test images, or with ``validation`` the fitting images against the validation ones.
    hooks = [h for h in cfg.custom_hooks if h.type != 'KNNProbeHook']
    for hook in cfg.custom_hooks:
        if hook.type == 'KNNProbeHook' and probe:
            hook.interval = schedule.get('probe_interval') or hook.interval
            reference = hook.reference_dataloader.dataset
            query = hook.query_dataloader.dataset
            reference.data_root = osp.join(objects, 'train')
            if schedule.get('validation'):
                reference.indices, query.indices = fit, val
                query.data_root = osp.join(objects, 'train')
            else:
                query.data_root = osp.join(objects, 'test')
            hooks.append(hook)
    cfg.custom_hooks = hooks
    return cfg


def split_indices(data_root: str, schedule: dict) -> Tuple[List[int], List[int]]:
    """Indices into the training folder (``CustomDataset`` order) of the images that train
    and of the validation images (none without ``validation``)."""
    _, labels = class_folder_files(osp.join(data_root, 'objects', 'train'))
    if schedule.get('validation'):
        fit, val = validation_split(labels.numpy())
        return fit.tolist(), val.tolist()
    return list(range(len(labels))), []


def _set_epochs(cfg: Config, epochs: int) -> None:
    """The whole schedule, warm-ups included, scaled to ``epochs``; a checkpoint every epoch."""
    scale = epochs / cfg.train_cfg.max_epochs
    cfg.train_cfg.max_epochs = epochs
    scale_schedulers(cfg, scale)
    for hook in cfg.custom_hooks:
        if hook.type == 'TeacherTempWarmupHook':
            hook.warmup_epochs = round(hook.warmup_epochs * scale)
        if hook.type == 'FreezeLastLayerHook':
            hook.freeze_epochs = min(hook.freeze_epochs, max(epochs - 1, 0))
    cfg.default_hooks.checkpoint.interval = 1
    cfg.default_hooks.checkpoint.max_keep_ckpts = epochs


def scale_schedulers(cfg: Config, scale: float, by_epoch: bool = True) -> None:
    """The begin and end of the schedulers counted in epochs (with ``by_epoch=False``: in
    iterations) times ``scale``, each at least one step long."""
    for scheduler in cfg.get('param_scheduler') or []:
        if scheduler.get('by_epoch', True) == by_epoch:
            scheduler.begin = round(scheduler.get('begin', 0) * scale)
            if scheduler.get('end') is not None:
                scheduler.end = max(round(scheduler.end * scale), scheduler.begin + 1)


def pretrain(cfg: Config) -> List[str]:
    """Train (or resume, or skip when finished); the checkpoints of every epoch."""
    final = osp.join(cfg.work_dir, f'epoch_{cfg.train_cfg.max_epochs}.pth')
    if not osp.isfile(final):
        cfg.resume = osp.isfile(osp.join(cfg.work_dir, 'last_checkpoint'))
        build_runner(cfg).train()
    return [osp.join(cfg.work_dir, f'epoch_{e}.pth')
            for e in range(1, cfg.train_cfg.max_epochs + 1)]


def prepare_data(data_root: Optional[str], transfer: bool) -> str:
    """The default data folder is written on the first run; a given one must exist."""
    if data_root is None:
        write_object_images(osp.join(DEFAULT_DATA_ROOT, 'objects'))
        write_scenes(osp.join(DEFAULT_DATA_ROOT, 'scenes'))
        return DEFAULT_DATA_ROOT
    needed = ['objects/dataset.json'] + (['scenes/dataset.json'] if transfer else [])
    missing = [n for n in needed if not osp.isfile(osp.join(data_root, n))]
    if missing:
        raise SystemExit(f"--data-root {data_root} lacks {', '.join(missing)}: write it with "
                         'python projects/mst_research/tools/write_animal_shapes.py '
                         f'{data_root}, or leave '
                         f'--data-root out to use {DEFAULT_DATA_ROOT}.')
    return data_root


def make_schedule(args: argparse.Namespace) -> dict:
    """The run's schedule: the quick or full one, with the command line's choices."""
    base = SCHEDULES['quick' if args.quick else 'full']
    return dict(
        base, seeds={v: args.seeds or base['seeds'][v] for v in args.variants},
        supervised_seeds=next(n for n in (args.supervised_seeds, args.seeds,
                                          base['supervised_seeds']) if n is not None),
        batch_size=args.batch_size, config=osp.abspath(args.config),
        epochs=(args.epochs or base['epochs']
                or Config.fromfile(args.config).train_cfg.max_epochs),
        transfer_targets=args.transfer_targets, validation=args.validation,
        probe_interval=args.probe_interval, cfg_options=args.cfg_options)


# DeiT's optimiser (mmpretrain's deit configs): AdamW, wd 0.05, none on norms, biases, the CLS
# token and the position embedding, clipped at 5. The lr is the pretraining's (5e-4 at batch 64):
# DeiT's 5e-4 x 64 / 512 barely moves a ViT from scratch in a few epochs.
LR, WEIGHT_DECAY = 5e-4, 0.05


def supervised_backbone(pretrain_cfg: Config) -> dict:
    """The pretraining's backbone without the [MASK] embedding, as MST builds its teacher:
    nothing is masked here, and the state dict has the teacher backbone's keys and shapes.
    Drop-path stays (the student's regulariser); eval mode switches it off."""
    return dict(copy.deepcopy(pretrain_cfg.model.backbone), use_mask_token=False,
                out_type='cls_token')  # the final-normed CLS token, as forward_mst returns


def supervised_config(pretrain_cfg: Config, data_root_objects: str, work_dir: str, epochs: int,
                      seed: int, indices: Optional[List[int]] = None,
                      batch_size: Optional[int] = None,
                      cfg_options: Optional[dict] = None) -> Config:
    """The mmengine config of one supervised run on ``data_root_objects/train`` (only the
    ``indices`` images when given, e.g. the fitting part of a validation split), merged with
    ``cfg_options`` last (e.g. a tuned lr, ``num_workers``)."""
    root = osp.join(data_root_objects, 'train')
    pre = pretrain_cfg.model.data_preprocessor
    loader = pretrain_cfg.train_dataloader
    workers = loader.get('num_workers', 0)
    classes = [d for d in os.listdir(root) if osp.isdir(osp.join(root, d))]  # CustomDataset's
    # The pretraining's warm-up share (1 of 6 epochs), held to 1-2 epochs; then cosine.
    warmup = max(1, min(2, round(epochs / 6)))
    schedule = [dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0,
                     end=min(warmup, epochs), convert_to_iter_based=True)]
    if epochs > warmup:
        schedule.append(dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True,
                             begin=warmup, end=epochs, convert_to_iter_based=True))
    # The pretraining's runtime (runner, scope, logging, RNG-state hook), less its MST hooks.
    hooks = {k: v for k, v in pretrain_cfg.default_hooks.items() if k != 'collapse_monitor'}
    # epoch_N.pth at the end only; latest.pth (and last_checkpoint) at the others, to resume.
    hooks['checkpoint'] = dict(type='SafeCheckpointHook', interval=epochs, max_keep_ckpts=1)
    cfg = Config(dict(
        model=dict(
            type='ImageClassifier',
            # The pretraining's normalisation; to_rgb: LoadImageFromFile reads BGR, the probe RGB.
            data_preprocessor=dict(type='ClsDataPreprocessor', mean=pre.mean, std=pre.std,
                                   to_rgb=pre.get('to_rgb', False)),
            backbone=supervised_backbone(pretrain_cfg),
            # A linear layer on the CLS token, the linear probe's view of the features;
            # cal_acc logs the training accuracy.
            head=dict(type='LinearClsHead', num_classes=len(classes),
                      in_channels=pretrain_cfg.model.backbone.arch.embed_dims,
                      loss=dict(type='CrossEntropyLoss'), cal_acc=True)),
        train_dataloader=dict(
            batch_size=batch_size or loader.batch_size, num_workers=workers,
            persistent_workers=workers > 0, drop_last=False,  # no BN: a short batch is fine
            sampler=dict(type='DefaultSampler', shuffle=True),
            collate_fn=dict(type='default_collate'),
            dataset=dict(
                type='CustomDataset', data_root=root, indices=indices,
                # mmpretrain's transforms only: a flip and a shift of up to 4 px (CIFAR's
                # recipe). Reflected padding continues the noise background: black borders
                # appear in no test image.
                pipeline=[dict(type='LoadImageFromFile'),
                          dict(type='RandomFlip', prob=0.5, direction='horizontal'),
                          dict(type='RandomCrop', crop_size=pretrain_cfg.model.backbone.img_size,
                               padding=4, padding_mode='reflect'),
                          dict(type='PackInputs')])),
        optim_wrapper=dict(
            type='OptimWrapper', clip_grad=dict(max_norm=5.0),
            # ours: foreach where this torch has no fused AdamW for the device (CPU, < 2.4)
            constructor='StudentOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=LR, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY,
                           fused=True),
            paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={
                '.cls_token': dict(decay_mult=0.0), '.pos_embed': dict(decay_mult=0.0)})),
        param_scheduler=schedule,
        train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=epochs),
        default_hooks=hooks,
        randomness=dict(seed=seed, diff_rank_seed=True),
        work_dir=work_dir,
        **{k: copy.deepcopy(pretrain_cfg[k]) for k in (
            'default_scope', 'custom_imports', 'runner_type', 'env_cfg', 'log_processor',
            'log_level', 'visualizer', 'launcher') if k in pretrain_cfg}))
    cfg.merge_from_dict(cfg_options or {})
    return cfg


def train_supervised(pretrain_cfg: Config, data_root_objects: str, work_dir: str, epochs: int,
                     seed: int, indices: Optional[List[int]] = None,
                     batch_size: Optional[int] = None,
                     cfg_options: Optional[dict] = None) -> str:
    """Train the supervised row (:func:`supervised_config`) and return its final checkpoint,
    ``work_dir/epoch_{epochs}.pth``; finished or cut short, as :func:`pretrain`."""
    return pretrain(supervised_config(pretrain_cfg, data_root_objects, work_dir, epochs, seed,
                                      indices, batch_size, cfg_options))[-1]


def load_backbone(backbone: Union[dict, nn.Module], checkpoint: Optional[str],
                  weights: str = 'teacher') -> nn.Module:
    """A backbone (built from its config if given one) in eval mode, with the weights that
    :func:`mst_mm.converters.backbone_state` finds in ``checkpoint``, every one required;
    ``checkpoint=None`` keeps the random initialisation (``init_weights``)."""
    if isinstance(backbone, dict):
        backbone = MODELS.build(backbone)
    if checkpoint is None:
        # init_weights logs a line per parameter (hundreds) where no runner has a log file.
        logger = MMLogger.get_current_instance()
        level = logger.level
        logger.setLevel(logging.WARNING)
        try:
            backbone.init_weights()
        finally:
            logger.setLevel(level)
    else:
        load_checked(backbone, backbone_state(checkpoint, weights), checkpoint,
                     "the config's backbone",
                     'Give an MST training checkpoint of this config, or its backbone.',
                     strict=True)
    backbone.eval()  # mmpretrain's ViT.train returns None: no chaining
    return backbone


def load_supervised_backbone(checkpoint: str, pretrain_cfg: Config
                             ) -> Tuple[nn.Module, List[float], List[float]]:
    """The trained backbone (eval mode; weights-only load, every weight required) with the mean
    and std it was trained with: ``embed_images(backbone, batches, mean, std)`` embeds RGB
    images with it as it does an MST teacher's (``model.teacher.module[0]``)."""
    backbone = load_backbone(supervised_backbone(pretrain_cfg), checkpoint, 'student')
    pre = pretrain_cfg.model.data_preprocessor
    return backbone, list(pre.mean), list(pre.std)
