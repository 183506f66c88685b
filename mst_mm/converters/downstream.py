"""The backbone of an MST training checkpoint as the backbone checkpoint of an mmdet or mmseg
config. mmdet and mmseg load backbones with ``strict=False`` and say nothing about
unmatched keys, so every converted key is checked against the backbone the config builds.
The core of ``tools/model_converters/mst2downstream.py``.
"""
import copy
import math
import os
import os.path as osp
import re
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.models.utils import resize_pos_embed as mmpretrain_resize_pos_embed

from mst_mm.errors import CheckpointError, UserInputError, some_keys
from mst_mm.models.algorithms.mst import PRETRAIN_ONLY_KEYS

from .checkpoint import extract_backbone, read_training_checkpoint
from .names import backbone_kind

DOWNSTREAM_TARGETS = {
    'mmdet': dict(
        backbone='swin', framework="mmdet's SwinTransformer",
        # mmdet's Swin keeps only the keys that start with 'backbone.' (and strips it).
        key_prefix='backbone.'),
    'mmseg': dict(
        backbone='vit', framework="mmseg's VisionTransformer",
        # mmseg's ViT does not strip prefixes: its keys must be bare.
        key_prefix=''),
}
# mmpretrain's attention is a fused qkv Linear and a proj Linear; mmseg's is mmcv's
# MultiheadAttention around nn.MultiheadAttention, whose in_proj stacks q, k, v in the
# same order, so only the names change.
VIT_TO_MMSEG = ((re.compile(r'^(layers\.\d+\.attn)\.qkv\.(weight|bias)$'), r'\1.attn.in_proj_\2'),
                (re.compile(r'^(layers\.\d+\.attn)\.proj\.(weight|bias)$'), r'\1.attn.out_proj.\2'))
# mmdet's FPN reads every Swin stage through its own norm{i}. MST reads only the last stage,
# so the checkpoint has the last norm alone; the others start as mmdet initialises them.
SWIN_STAGE_NORM = re.compile(r'^norm(\d+)\.(weight|bias)$')


def rename_for_target(backbone: Dict[str, torch.Tensor], target: str) -> Dict[str, torch.Tensor]:
    """mmpretrain names -> the target framework's names (mmdet's Swin shares them)."""
    if target == 'mmdet':
        return dict(backbone)  # mmpretrain's and mmdet's Swin share names and layouts
    renamed = {}
    for key, value in backbone.items():
        for pattern, replacement in VIT_TO_MMSEG:
            key = pattern.sub(replacement, key)
        renamed[key] = value
    return renamed


def build_target_backbone(config: Config, target: str) -> torch.nn.Module:
    """The backbone the downstream config (or its path) builds, without pretrained weights."""
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    backbone_cfg = copy.deepcopy(cfg.model.backbone)
    backbone_cfg.pop('init_cfg', None)
    if target == 'mmdet':
        import mmdet.models  # noqa: F401  (registers the backbones)
        from mmdet.registry import MODELS
    else:
        import mmseg.models  # noqa: F401
        from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope(target):
        return MODELS.build(backbone_cfg)


def resize_pos_embed(pos_embed: torch.Tensor, target_shape: torch.Size,
                     mode: str) -> torch.Tensor:
    """Resize a (1, 1 + h * w, C) embedding with a CLS token to ``target_shape``."""
    src = int(math.isqrt(pos_embed.shape[1] - 1))
    dst = int(math.isqrt(target_shape[1] - 1))
    if src * src + 1 != pos_embed.shape[1] or dst * dst + 1 != target_shape[1]:
        raise CheckpointError(f'Cannot resize pos_embed {tuple(pos_embed.shape)} to '
                              f'{tuple(target_shape)}: only square patch grids are supported.')
    return mmpretrain_resize_pos_embed(pos_embed, (src, src), (dst, dst), mode=mode,
                                       num_extra_tokens=1)


def match_target(converted: Dict[str, torch.Tensor], target_model: torch.nn.Module,
                 target: str) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """``converted`` made to match the target's keys exactly, and notes on what was adapted
    (a resized position embedding, Swin stage norms that MST never trained); or an error
    naming what differs."""
    expected = target_model.state_dict()
    converted, notes = dict(converted), []
    if 'pos_embed' in converted and converted['pos_embed'].shape != expected['pos_embed'].shape:
        old = tuple(converted['pos_embed'].shape)
        mode = getattr(target_model, 'interpolate_mode', 'bicubic')
        converted['pos_embed'] = resize_pos_embed(converted['pos_embed'],
                                                  expected['pos_embed'].shape, mode)
        notes.append(f'resized pos_embed {old} -> {tuple(expected["pos_embed"].shape)} '
                     f'({mode}) for the downstream input size')
    if target == 'mmdet':
        trained = [int(m[1]) for m in map(SWIN_STAGE_NORM.match, converted) if m]
        last = max(trained, default=-1)
        fresh = sorted(k for k in expected if k not in converted
                       and (m := SWIN_STAGE_NORM.match(k)) and int(m[1]) < last)
        for key in fresh:
            converted[key] = expected[key].clone()
        if fresh:
            notes.append(f'added {", ".join(fresh)} as mmdet initialises them: the FPN reads '
                         'the earlier stages through these norms, which MST pretraining '
                         'never uses')

    missing = sorted(set(expected) - set(converted))
    unexpected = sorted(set(converted) - set(expected))
    mismatched = sorted(f'{k}: {tuple(converted[k].shape)} vs {tuple(expected[k].shape)}'
                        for k in set(expected) & set(converted)
                        if converted[k].shape != expected[k].shape)
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f'The checkpoint does not match the backbone of the {target} config: '
            f'missing {some_keys(missing) or "none"}; '
            f'unexpected {some_keys(unexpected) or "none"}; '
            f'shape mismatches {some_keys(mismatched) or "none"}. The pretrained architecture '
            'differs from the downstream one: pass --config with a downstream config whose '
            'backbone has the same size as the pretrained one.')
    return converted, notes


def convert_for_downstream(checkpoint: str, out: str, target: str, config,
                           weights: str = 'teacher',
                           log: Optional[Callable[[str], None]] = print
                           ) -> Dict[str, torch.Tensor]:
    """Convert an MST training checkpoint for the backbone of ``config`` and write ``out``.

    Args:
        checkpoint (str): An MST training checkpoint, read weights-only.
        out (str): Where to write ``dict(state_dict=..., meta=...)``, keys prefixed as the
            target's backbone loads them (``backbone.`` for mmdet, none for mmseg).
        target (str): ``'mmdet'`` (a Swin) or ``'mmseg'`` (a ViT).
        config (Config | str): The downstream config whose backbone the keys must match.
        weights (str): ``'teacher'`` (the EMA teacher) or ``'student'``.
        log (callable, optional): Receives what was done (default ``print``); None is silent.

    Returns:
        dict: The converted tensors under the backbone's own names (no prefix).
    """
    if target not in DOWNSTREAM_TARGETS:
        raise UserInputError(f'target must be one of {sorted(DOWNSTREAM_TARGETS)}, '
                              f'got {target!r}.')
    loaded = read_training_checkpoint(checkpoint, out)
    backbone = extract_backbone(loaded['state_dict'], weights, checkpoint)
    kind = backbone_kind(backbone)
    spec = DOWNSTREAM_TARGETS[target]
    if kind != spec['backbone']:
        other = next(t for t, s in DOWNSTREAM_TARGETS.items() if s['backbone'] == kind)
        raise UserInputError(
            f'--target {target} fine-tunes {spec["framework"]}, but {checkpoint} holds an MST '
            f'{"Swin" if kind == "swin" else "ViT"} backbone: use --target {other}, or pretrain '
            f'the matching backbone.')

    cfg = Config.fromfile(config) if isinstance(config, str) else config
    renamed = rename_for_target(backbone, target)
    converted, notes = match_target(renamed, build_target_backbone(cfg, target), target)
    config_name = osp.abspath(config) if isinstance(config, str) else cfg.filename
    meta = dict(source=osp.abspath(checkpoint), weights=weights, target=target,
                config=config_name, epoch=loaded.get('meta', {}).get('epoch'),
                iter=loaded.get('meta', {}).get('iter'))
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    torch.save(dict(state_dict={spec['key_prefix'] + k: v for k, v in converted.items()},
                    meta=meta), out)

    if log is not None:
        log(f'Converted {len(backbone)} tensors of the {weights} backbone (MST '
            f'{"Swin" if kind == "swin" else "ViT"}, epoch {meta["epoch"]}) for '
            f'{spec["framework"]}; dropped {", ".join(PRETRAIN_ONLY_KEYS)} (pretraining only).')
        for note in notes:
            log(f'  {note}')
        shown = osp.relpath(config_name) if config_name else 'the given config'
        log(f'All {len(converted)} keys match the backbone of {shown}. Wrote {out}')
    return converted
