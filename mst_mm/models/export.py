"""The backbone of an MST training checkpoint, for other code bases.

mmpretrain or timm names (as DINO ships its ViTs), or the backbone checkpoint of an mmdet or
mmseg config. mmdet and mmseg load backbones with ``strict=False`` and say nothing about
unmatched keys, so every converted key is checked against the backbone the config builds.
The core of ``tools/model_converters/mst2downstream.py``, shared with
:func:`mst_mm.evidence.transfer.finetune` and the tests.
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

from mst_mm.errors import CheckpointError, UserInputError

SOURCE_PREFIXES = {'teacher': 'teacher.module.0.', 'student': 'backbone.'}
# Parameters that only pretraining uses: the [MASK] token of the student.
PRETRAIN_ONLY_KEYS = ('mask_token', )

# mmpretrain VisionTransformer -> timm VisionTransformer. Both keep q, k, v stacked in one
# Linear in the same order, and the class token first in pos_embed, so only names change.
_VIT_TO_TIMM: Tuple[Tuple[re.Pattern, str], ...] = tuple(
    (re.compile(pattern), replacement) for pattern, replacement in (
        (r'^(cls_token|pos_embed)$', r'\1'),
        (r'^patch_embed\.projection\.(weight|bias)$', r'patch_embed.proj.\1'),
        (r'^layers\.(\d+)\.ln1\.(weight|bias)$', r'blocks.\1.norm1.\2'),
        (r'^layers\.(\d+)\.ln2\.(weight|bias)$', r'blocks.\1.norm2.\2'),
        (r'^layers\.(\d+)\.attn\.qkv\.(weight|bias)$', r'blocks.\1.attn.qkv.\2'),
        (r'^layers\.(\d+)\.attn\.proj\.(weight|bias)$', r'blocks.\1.attn.proj.\2'),
        (r'^layers\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)$', r'blocks.\1.mlp.fc1.\2'),
        (r'^layers\.(\d+)\.ffn\.layers\.1\.(weight|bias)$', r'blocks.\1.mlp.fc2.\2'),
        (r'^ln1\.(weight|bias)$', r'norm.\1'),  # mmpretrain's final norm
    ))


def extract_backbone(state_dict: Dict[str, torch.Tensor], weights: str = 'teacher',
                     source: str = 'the checkpoint') -> Dict[str, torch.Tensor]:
    """The ``'teacher'`` (EMA) or ``'student'`` backbone of an MST ``state_dict``, with
    mmpretrain names and without pretraining-only keys; ``source`` names it in errors."""
    if weights not in SOURCE_PREFIXES:
        raise UserInputError(f'weights must be one of {sorted(SOURCE_PREFIXES)}, '
                              f'got {weights!r}.')
    if not any(k.startswith(SOURCE_PREFIXES['teacher']) for k in state_dict):
        raise CheckpointError(
            f'{source} is not an MST training checkpoint: it has no '
            f"'{SOURCE_PREFIXES['teacher']}*' keys (the EMA teacher's backbone). Give the "
            '.pth that tools/train.py wrote for an MST config, e.g. '
            'work_dirs/mst_deit-s-p16_8xb128-coslr-300e_in1k/epoch_300.pth.')
    prefix = SOURCE_PREFIXES[weights]
    return {k[len(prefix):]: v for k, v in state_dict.items()
            if k.startswith(prefix) and k[len(prefix):] not in PRETRAIN_ONLY_KEYS}


def backbone_kind(backbone: Dict[str, torch.Tensor]) -> str:
    """``'vit'`` or ``'swin'``, from the names of the backbone's tensors."""
    if 'patch_embed.projection.weight' in backbone and 'layers.0.attn.qkv.weight' in backbone:
        return 'vit'
    if 'stages.0.blocks.0.attn.w_msa.qkv.weight' in backbone:
        return 'swin'
    raise CheckpointError('The checkpoint holds neither an MST ViT (MaskViT) nor an MST Swin '
                          '(MaskSwin) backbone; its first keys are '
                          f'{sorted(backbone)[:5]}.')


def vit_to_timm(backbone: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An mmpretrain ViT's tensors (shared, not copied) under timm's names.

    Loads with ``strict=True`` into ``timm.create_model('vit_small_patch16_224',
    num_classes=0)`` for DeiT-S, as DINO's released backbones do; a tensor without a timm
    counterpart (a layer scale, no class token) is refused by name.
    """
    renamed, unknown = {}, []
    for key, value in backbone.items():
        for pattern, replacement in _VIT_TO_TIMM:
            if pattern.match(key):
                renamed[pattern.sub(replacement, key)] = value
                break
        else:
            unknown.append(key)
    missing = [k for k in ('cls_token', 'pos_embed', 'norm.weight') if k not in renamed]
    if unknown or missing:
        raise CheckpointError(
            "The ViT does not have the layout of timm's VisionTransformer: "
            f'tensors without a timm name: {", ".join(sorted(unknown)[:8]) or "none"}; '
            f'timm tensors not provided: {", ".join(missing) or "none"}. The timm export '
            'covers ViTs with a class token, a final norm and no layer scale (DeiT-S: '
            "vit_small_patch16_224); use --target mmpretrain for the others.")
    return renamed


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


def load_training_checkpoint(checkpoint: str, out: str) -> dict:
    """An MST training checkpoint, refused when it is ``out`` or holds no ``state_dict``."""
    if osp.abspath(out) == osp.abspath(checkpoint):
        raise UserInputError(f'OUT is the input checkpoint {checkpoint}: choose another path, '
                              'the converted file holds only the backbone.')
    # Imported here: models/ does not import engine/ when the package is imported.
    from mst_mm.engine.safe_loading import read_checkpoint
    loaded = read_checkpoint(checkpoint, map_location='cpu')
    if not isinstance(loaded, dict) or 'state_dict' not in loaded:
        raise CheckpointError(f'{checkpoint} is not an MST training checkpoint: expected a dict '
                              "with a 'state_dict' entry, as mmengine saves.")
    return loaded


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
    from mmpretrain.models.utils import resize_pos_embed as resize
    src = int(math.isqrt(pos_embed.shape[1] - 1))
    dst = int(math.isqrt(target_shape[1] - 1))
    if src * src + 1 != pos_embed.shape[1] or dst * dst + 1 != target_shape[1]:
        raise CheckpointError(f'Cannot resize pos_embed {tuple(pos_embed.shape)} to '
                              f'{tuple(target_shape)}: only square patch grids are supported.')
    return resize(pos_embed, (src, src), (dst, dst), mode=mode, num_extra_tokens=1)


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
        def show(keys):
            return ', '.join(keys[:8]) + (f' ... ({len(keys)} in all)' if len(keys) > 8 else '')
        raise CheckpointError(
            f'The checkpoint does not match the backbone of the {target} config: '
            f'missing {show(missing) or "none"}; unexpected {show(unexpected) or "none"}; '
            f'shape mismatches {show(mismatched) or "none"}. The pretrained architecture '
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
    loaded = load_training_checkpoint(checkpoint, out)
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
