"""The evidence run's supervised row: the ceiling that the self-supervised rows are read against
(docs/evidence.md). The pretraining config's ViT, as its ``model.backbone`` builds it, trained
with the labels (cross-entropy) on the same training images, then probed like the EMA teachers:
:func:`load_supervised_backbone` gives what ``embed_images`` takes."""
import copy
import os
import os.path as osp
from typing import List, Optional, Tuple

import torch.nn as nn
from mmengine.config import Config

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
    ``work_dir/epoch_{epochs}.pth``. A finished run is not trained again; a cut one resumes
    from its last epoch, as ``pretrain()`` in tools/evidence.py."""
    import mst_mm  # noqa: F401  (registers MaskViT, CheckedRunner and the hooks)
    from mst_mm.engine import build_runner
    final = osp.join(work_dir, f'epoch_{epochs}.pth')
    if not osp.isfile(final):
        cfg = supervised_config(pretrain_cfg, data_root_objects, work_dir, epochs, seed, indices,
                                batch_size, cfg_options)
        cfg.resume = osp.isfile(osp.join(work_dir, 'last_checkpoint'))
        build_runner(cfg).train()
    return final


def load_supervised_backbone(checkpoint: str, pretrain_cfg: Config
                             ) -> Tuple[nn.Module, List[float], List[float]]:
    """The trained backbone (eval mode; weights-only load, every weight required) with the mean
    and std it was trained with: ``embed_images(backbone, batches, mean, std)`` embeds RGB
    images with it as it does an MST teacher's (``model.teacher.module[0]``)."""
    from mmpretrain.registry import MODELS

    import mst_mm  # noqa: F401
    from mst_mm.engine.safe_loading import load_checked, read_checkpoint
    from mst_mm.models.export import extract_backbone
    backbone = MODELS.build(supervised_backbone(pretrain_cfg))
    state = read_checkpoint(checkpoint, map_location='cpu')
    state = state.get('state_dict', state) if isinstance(state, dict) else {}
    load_checked(backbone, extract_backbone(state, 'student', checkpoint), checkpoint,
                 'the supervised ViT', 'Give the epoch_N.pth of train_supervised.', strict=True)
    backbone.eval()  # mmpretrain's ViT.train returns None: no chaining
    pre = pretrain_cfg.model.data_preprocessor
    return backbone, list(pre.mean), list(pre.std)
