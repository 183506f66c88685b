"""The backbone of an MST training checkpoint, for other code bases.

mmpretrain or timm names (as DINO ships its ViTs), or the backbone checkpoint of an mmdet or
mmseg config. mmdet and mmseg load backbones with ``strict=False`` and say nothing about
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

from mst_mm.engine.safe_loading import read_checkpoint
from mst_mm.errors import CheckpointError, UserInputError, some_keys
from mst_mm.models.algorithms.mst import NECK_PREFIXES, PRETRAIN_ONLY_KEYS

from .checkpoint import extract_backbone

# mmpretrain VisionTransformer <-> timm VisionTransformer. Both keep q, k, v stacked in one
# Linear in the same order, and the class token first in pos_embed, so only names change.
# One table serves both directions, so that the two renamings are inverses by construction.
_VIT_TIMM_NAMES: Tuple[Tuple[str, str], ...] = (
    ('cls_token', 'cls_token'),
    ('pos_embed', 'pos_embed'),
    ('patch_embed.projection.{p}', 'patch_embed.proj.{p}'),
    ('layers.{i}.ln1.{p}', 'blocks.{i}.norm1.{p}'),
    ('layers.{i}.ln2.{p}', 'blocks.{i}.norm2.{p}'),
    ('layers.{i}.attn.qkv.{p}', 'blocks.{i}.attn.qkv.{p}'),
    ('layers.{i}.attn.proj.{p}', 'blocks.{i}.attn.proj.{p}'),
    ('layers.{i}.ffn.layers.0.0.{p}', 'blocks.{i}.mlp.fc1.{p}'),
    ('layers.{i}.ffn.layers.1.{p}', 'blocks.{i}.mlp.fc2.{p}'),
    ('ln1.{p}', 'norm.{p}'),  # mmpretrain's final norm
)


def _name_pattern(template: str) -> re.Pattern:
    """A template of ``_VIT_TIMM_NAMES`` as a regex: ``{i}`` a block index, ``{p}`` weight or
    bias."""
    pattern = re.escape(template).replace(r'\{i\}', r'(?P<i>\d+)')
    return re.compile('^' + pattern.replace(r'\{p\}', r'(?P<p>weight|bias)') + '$')


_VIT_TO_TIMM = tuple((_name_pattern(ours), timm) for ours, timm in _VIT_TIMM_NAMES)
_TIMM_TO_VIT = tuple((_name_pattern(timm), ours) for ours, timm in _VIT_TIMM_NAMES)


def _rename(state: Dict[str, torch.Tensor], table) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """``state`` renamed by the first pattern of ``table`` that matches each key (tensors
    shared, not copied), and the keys that none matches."""
    renamed, unknown = {}, []
    for key, value in state.items():
        for pattern, template in table:
            match = pattern.match(key)
            if match:
                renamed[template.format(**match.groupdict())] = value
                break
        else:
            unknown.append(key)
    return renamed, unknown


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
    renamed, unknown = _rename(backbone, _VIT_TO_TIMM)
    missing = [k for k in ('cls_token', 'pos_embed', 'norm.weight') if k not in renamed]
    if unknown or missing:
        raise CheckpointError(
            "The ViT does not have the layout of timm's VisionTransformer: "
            f'tensors without a timm name: {", ".join(sorted(unknown)[:8]) or "none"}; '
            f'timm tensors not provided: {", ".join(missing) or "none"}. The timm export '
            'covers ViTs with a class token, a final norm and no layer scale (DeiT-S: '
            "vit_small_patch16_224); use --target mmpretrain for the others.")
    return renamed



def timm_to_vit(backbone: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A timm VisionTransformer's tensors (shared, not copied) under mmpretrain's names: the
    inverse of :func:`vit_to_timm`.

    Takes the key names of DINO's released ViTs and of ``timm.create_model(
    'vit_small_patch16_224', num_classes=0)``; a classifier (``head.*``) must be dropped by
    the caller. A tensor without an mmpretrain counterpart (a layer scale, register tokens,
    DINOv2's [MASK] token) is refused by name.
    """
    renamed, unknown = _rename(backbone, _TIMM_TO_VIT)
    if unknown:
        raise CheckpointError(
            "The weights do not have the layout of timm's VisionTransformer (DINO's ViT): "
            f"tensors without a counterpart in MST's ViT: {some_keys(sorted(unknown))}. Only "
            'ViTs with a class token, a final norm and no layer scale or register tokens '
            "convert (DINO's ViT-S/16 and ViT-B/16, timm's vit_small_patch16_224 and "
            'vit_base_patch16_224).')
    return renamed


# DINO's head (facebookresearch/dino DINOHead) and our DINONeck share the MLP's index layout
# (Linear[-BN]-GELU per hidden layer, then Linear). The last layer differs in name only:
# DINO weight-normalises it with the old nn.utils.weight_norm (weight_g, weight_v), DINONeck
# with torch.nn.utils.parametrizations.weight_norm (original0 = g, original1 = v), each
# (K, 1) and (K, bottleneck).
_DINO_LAST_LAYER = (('last_layer.weight_g', 'last_layer.parametrizations.weight.original0'),
                    ('last_layer.weight_v', 'last_layer.parametrizations.weight.original1'))
_ONE_LINEAR_MLP = re.compile(r'^mlp\.(weight|bias)$')  # DINOHead with nlayers=1


def dino_head_to_neck(head: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A DINO head's tensors (names after ``head.``) under DINONeck's names.

    ``last_layer.weight_g`` / ``weight_v`` become the weight-norm parametrization's
    ``original0`` / ``original1``; a one-layer head's ``mlp.weight`` becomes ``mlp.0.weight``
    (DINONeck keeps a Sequential). Anything else keeps its name.
    """
    names = dict(_DINO_LAST_LAYER)
    return {names.get(key) or _ONE_LINEAR_MLP.sub(r'mlp.0.\1', key): value
            for key, value in head.items()}


def neck_to_dino_head(neck: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """DINONeck's tensors under the names of DINO's head: the inverse of
    :func:`dino_head_to_neck`."""
    names = {ours: theirs for theirs, ours in _DINO_LAST_LAYER}
    single = all(not k.startswith('mlp.') or k.startswith('mlp.0.') for k in neck)
    return {names.get(key) or (re.sub(r'^mlp\.0\.', 'mlp.', key) if single else key): value
            for key, value in neck.items()}


def mst_to_dino(state_dict: Dict[str, torch.Tensor],
                source: str = 'the checkpoint') -> Dict[str, dict]:
    """An MST ViT training state dict in the layout of DINO's full checkpoints.

    ``student`` and ``teacher`` hold ``backbone.*`` (timm names, as DINO's
    ``VisionTransformer``) and ``head.*`` (DINO's head), and ``dino_loss`` the centre, so that
    DINO's ``eval_knn.py`` and ``eval_linear.py`` read the teacher with ``--checkpoint_key
    teacher`` and ``main_dino.py`` can restart from it. The student's keys carry DDP's
    ``module.`` prefix and the teacher's only when the head has BatchNorm, as
    ``main_dino.py`` saves them: its restart loads with ``strict=False``, so a prefix it does
    not expect would load nothing, silently. The [MASK] token and the image decoder have no
    place in DINO's format and are left out; so are the optimiser and the epoch (DINO
    restarts at epoch 0 with its own optimiser).
    """
    student = extract_backbone(state_dict, 'student', source)
    teacher = extract_backbone(state_dict, 'teacher', source)
    if backbone_kind(teacher) != 'vit':
        raise UserInputError(f"DINO's format holds ViTs, but {source} holds an MST Swin "
                             'backbone: use --target mmpretrain (or mmdet for Mask R-CNN).')
    necks = {name: {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
             for name, prefix in NECK_PREFIXES.items()}
    if not necks['student'] or not necks['teacher'] or 'head.center' not in state_dict:
        raise CheckpointError(f'{source} has no DINO head (neck.*, teacher.module.1.*) or '
                              'no centre (head.center): it is not an MST checkpoint of a '
                              'model with DINONeck and DINODistillHead.')
    with_bn = any(k.endswith('running_mean') for k in necks['teacher'])
    prefixes = dict(student='module.', teacher='module.' if with_bn else '')
    saved = {}
    for name, backbone in (('student', student), ('teacher', teacher)):
        saved[name] = {
            **{f'{prefixes[name]}backbone.{k}': v for k, v in vit_to_timm(backbone).items()},
            **{f'{prefixes[name]}head.{k}': v
               for k, v in neck_to_dino_head(necks[name]).items()}}
    saved['dino_loss'] = dict(center=state_dict['head.center'])
    return saved

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
