"""An MST training checkpoint as the backbone checkpoint of an mmdet or mmseg config.

The core of ``tools/model_converters/mst2downstream.py --target mmdet/mmseg``, here so that
the tool, :func:`mst_mm.evaluation.transfer.finetune` and the tests share it. mmdet and
mmseg load pretrained backbones with ``strict=False`` and say nothing about keys that did not
match, so the converted keys are checked one by one against the backbone that the downstream
config builds, and anything but an exact match is refused with the keys named.
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

from .backbone_export import PRETRAIN_ONLY_KEYS, ConversionError, backbone_kind, extract_backbone
from .safe_loading import load_local_checkpoint

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
        raise ConversionError(f'OUT is the input checkpoint {checkpoint}: choose another path, '
                              'the converted file holds only the backbone.')
    loaded = load_local_checkpoint(checkpoint, map_location='cpu')
    if not isinstance(loaded, dict) or 'state_dict' not in loaded:
        raise ConversionError(f'{checkpoint} is not an MST training checkpoint: expected a dict '
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
    """The backbone the downstream config builds, without loading its pretrained weights.

    Args:
        config (Config | str): The downstream config or its path.
        target (str): ``'mmdet'`` or ``'mmseg'``.
    """
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
        raise ConversionError(f'Cannot resize pos_embed {tuple(pos_embed.shape)} to '
                              f'{tuple(target_shape)}: only square patch grids are supported.')
    return resize(pos_embed, (src, src), (dst, dst), mode=mode, num_extra_tokens=1)


def match_target(converted: Dict[str, torch.Tensor], target_model: torch.nn.Module,
                 target: str) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Make ``converted`` match the target's keys exactly, or raise naming what differs.

    Returns:
        tuple: The matching tensors and notes on what was adapted (a resized position
        embedding, Swin stage norms that pretraining never trained).
    """
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
        raise ConversionError(
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
        checkpoint (str): An MST training checkpoint (a dict with ``state_dict``, as
            mmengine saves it), read weights-only.
        out (str): Where to write ``dict(state_dict=..., meta=...)``; the keys carry the
            prefix that the target's backbone loads (``backbone.`` for mmdet, none for mmseg).
        target (str): ``'mmdet'`` (a Swin) or ``'mmseg'`` (a ViT).
        config (Config | str): The downstream config whose backbone the keys must match.
        weights (str): ``'teacher'`` (the EMA teacher) or ``'student'``.
        log (callable, optional): Receives the lines that say what was done (default
            ``print``); None is silent.

    Returns:
        dict: The converted tensors under the backbone's own names (no prefix).

    Raises:
        ConversionError: Not an MST checkpoint, the wrong backbone for ``target``, or keys
            or shapes that do not match the config's backbone (named in the message).
    """
    if target not in DOWNSTREAM_TARGETS:
        raise ConversionError(f'target must be one of {sorted(DOWNSTREAM_TARGETS)}, '
                              f'got {target!r}.')
    loaded = load_training_checkpoint(checkpoint, out)
    backbone = extract_backbone(loaded['state_dict'], weights, checkpoint)
    kind = backbone_kind(backbone)
    spec = DOWNSTREAM_TARGETS[target]
    if kind != spec['backbone']:
        other = next(t for t, s in DOWNSTREAM_TARGETS.items() if s['backbone'] == kind)
        raise ConversionError(
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
