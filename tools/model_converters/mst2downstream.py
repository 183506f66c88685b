# Copyright (c) mst_mm contributors.
"""Turn an MST training checkpoint into a backbone checkpoint for mmdet, mmseg, mmpretrain
or timm.

Examples::

    # Swin-T teacher -> mmdet's SwinTransformer (Mask R-CNN, COCO)
    python tools/model_converters/mst2downstream.py \\
        work_dirs/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k/epoch_100.pth \\
        pretrain/mst_swin-t_mmdet.pth --target mmdet
    # DeiT-S teacher -> mmseg's VisionTransformer (SETR, Cityscapes 768 x 768)
    python tools/model_converters/mst2downstream.py \\
        work_dirs/mst_deit-s-p16_8xb128-coslr-300e_in1k/epoch_300.pth \\
        pretrain/mst_deit-s_mmseg.pth --target mmseg
    # backbone only, mmpretrain names (for a backbone's init_cfg=dict(type='Pretrained', ...))
    python tools/model_converters/mst2downstream.py CKPT mst_deit-s_backbone.pth --target mmpretrain
    # backbone only, timm names, as DINO ships its weights: loads with strict=True into
    # timm.create_model('vit_small_patch16_224', num_classes=0) for a DeiT-S
    python tools/model_converters/mst2downstream.py CKPT mst_deit-s_timm.pth --target timm

For mmdet and mmseg the keys are checked one by one against the backbone that the
downstream config builds (``--config``, by default ours under ``configs/benchmarks/``),
because mmdet and mmseg load pretrained backbones with ``strict=False`` and say nothing
about keys that did not match. Anything that is not an exact match is refused, with the
keys named. The checkpoint is read weights-only (``mst_mm.engine.load_local_checkpoint``),
so a pickle that would run code is refused before anything in it is used, and a truncated
or unreadable file is named with what is wrong with it. Every refusal ends the command with
one message and exit status 2.
"""
import argparse
import copy
import math
import os
import os.path as osp
import re
import sys
from typing import Dict, List, Tuple

import torch

# Running as `python tools/...` from a source checkout must work without an install.
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmengine.config import Config  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402

from mst_mm.engine import load_local_checkpoint  # noqa: E402
from mst_mm.engine.backbone_export import (  # noqa: E402
    PRETRAIN_ONLY_KEYS,
    SOURCE_PREFIXES,
    ConversionError,
    backbone_kind,
    extract_backbone,
    vit_to_timm,
)
from mst_mm.engine.cli import run_tool  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TARGETS = {
    'mmdet': dict(
        config='configs/benchmarks/mmdetection/mask-rcnn_mst-swin-t-p4-w7_fpn_1x_coco.py',
        backbone='swin', framework="mmdet's SwinTransformer",
        # mmdet's Swin keeps only the keys that start with 'backbone.' (and strips it).
        key_prefix='backbone.'),
    'mmseg': dict(
        config='configs/benchmarks/mmsegmentation/'
        'setr_mst-deit-s_naive_8xb1-40k_cityscapes-768x768.py',
        backbone='vit', framework="mmseg's VisionTransformer",
        # mmseg's ViT does not strip prefixes: its keys must be bare.
        key_prefix=''),
}
# Backbone-only exports: no downstream config to match, the names are the point.
BACKBONE_ONLY = {
    'mmpretrain': "mmpretrain's backbone names (MaskViT / VisionTransformer, MaskSwin / "
                  'SwinTransformer)',
    'timm': "timm's VisionTransformer names (DeiT-S: vit_small_patch16_224)",
}
# mmpretrain's attention is a fused qkv Linear and a proj Linear; mmseg's is mmcv's
# MultiheadAttention around nn.MultiheadAttention, whose in_proj stacks q, k, v in the
# same order, so only the names change.
VIT_TO_MMSEG = ((re.compile(r'^(layers\.\d+\.attn)\.qkv\.(weight|bias)$'), r'\1.attn.in_proj_\2'),
                (re.compile(r'^(layers\.\d+\.attn)\.proj\.(weight|bias)$'), r'\1.attn.out_proj.\2'))
# mmdet's FPN reads every Swin stage through norm0..norm3. MST reads only the last stage, so
# the checkpoint has norm3 alone; the others start as mmdet initialises them.
UNTRAINED_SWIN_NORMS = re.compile(r'^norm[0-2]\.(weight|bias)$')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert an MST checkpoint into an mmdet / mmseg backbone checkpoint.')
    parser.add_argument('checkpoint', help='MST training checkpoint (as tools/train.py saves)')
    parser.add_argument('out', help='where to write the backbone checkpoint')
    parser.add_argument('--target', required=True, choices=sorted({*TARGETS, *BACKBONE_ONLY}),
                        help='mmdet (Swin-T, Mask R-CNN) or mmseg (ViT, SETR): a checkpoint '
                        'checked against the downstream config\'s backbone; mmpretrain: the '
                        'backbone alone with mmpretrain\'s names; timm: the ViT backbone '
                        'alone with timm\'s names, as DINO ships its weights')
    parser.add_argument('--weights', default='teacher', choices=sorted(SOURCE_PREFIXES),
                        help='the EMA teacher (default, as DINO evaluates) or the student')
    parser.add_argument('--config', help='mmdet / mmseg: downstream config whose backbone '
                        'the keys must match (default: ours for the target under '
                        'configs/benchmarks/)')
    return parser.parse_args(argv)


def rename_for_target(backbone: Dict[str, torch.Tensor], target: str) -> Dict[str, torch.Tensor]:
    if target == 'mmdet':
        return dict(backbone)  # mmpretrain's and mmdet's Swin share names and layouts
    renamed = {}
    for key, value in backbone.items():
        for pattern, replacement in VIT_TO_MMSEG:
            key = pattern.sub(replacement, key)
        renamed[key] = value
    return renamed


def build_target_backbone(config_path: str, target: str) -> torch.nn.Module:
    """The backbone the downstream config builds, without loading its pretrained weights."""
    cfg = Config.fromfile(config_path)
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
    """Make ``converted`` match the target's keys exactly, or raise naming what differs."""
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
        fresh = sorted(k for k in expected if k not in converted and UNTRAINED_SWIN_NORMS.match(k))
        for key in fresh:
            converted[key] = expected[key].clone()
        if fresh:
            notes.append(f'added {", ".join(fresh)} as mmdet initialises them: the FPN reads '
                         'stages 0-2 through these norms, which MST pretraining never uses')

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


def convert(checkpoint: str, out: str, target: str, weights: str = 'teacher',
            config: str = None) -> Dict[str, torch.Tensor]:
    """Convert ``checkpoint`` and write ``out``; returns the converted backbone tensors."""
    if osp.abspath(out) == osp.abspath(checkpoint):
        raise ConversionError(f'OUT is the input checkpoint {checkpoint}: choose another path, '
                              'the converted file holds only the backbone.')
    loaded = load_local_checkpoint(checkpoint, map_location='cpu')
    if not isinstance(loaded, dict) or 'state_dict' not in loaded:
        raise ConversionError(f'{checkpoint} is not an MST training checkpoint: expected a dict '
                              "with a 'state_dict' entry, as mmengine saves.")
    backbone = extract_backbone(loaded['state_dict'], weights, checkpoint)
    kind = backbone_kind(backbone)
    if target in BACKBONE_ONLY:
        return export_backbone_only(backbone, kind, loaded, checkpoint, out, target, weights)
    spec = TARGETS[target]
    config = config or osp.join(REPO, spec['config'])
    if kind != spec['backbone']:
        other = next(t for t, s in TARGETS.items() if s['backbone'] == kind)
        raise ConversionError(
            f'--target {target} fine-tunes {spec["framework"]}, but {checkpoint} holds an MST '
            f'{"Swin" if kind == "swin" else "ViT"} backbone: use --target {other}, or pretrain '
            f'the matching backbone.')

    renamed = rename_for_target(backbone, target)
    converted, notes = match_target(renamed, build_target_backbone(config, target), target)
    meta = dict(source=osp.abspath(checkpoint), weights=weights, target=target,
                config=osp.abspath(config), epoch=loaded.get('meta', {}).get('epoch'),
                iter=loaded.get('meta', {}).get('iter'))
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    torch.save(dict(state_dict={spec['key_prefix'] + k: v for k, v in converted.items()},
                    meta=meta), out)

    print(f'Converted {len(backbone)} tensors of the {weights} backbone (MST '
          f'{"Swin" if kind == "swin" else "ViT"}, epoch {meta["epoch"]}) for '
          f'{spec["framework"]}; dropped {", ".join(PRETRAIN_ONLY_KEYS)} (pretraining only).')
    for note in notes:
        print(f'  {note}')
    print(f'All {len(converted)} keys match the backbone of {osp.relpath(config)}. '
          f'Wrote {out}')
    return converted


def export_backbone_only(backbone: Dict[str, torch.Tensor], kind: str, loaded: dict,
                         checkpoint: str, out: str, target: str,
                         weights: str) -> Dict[str, torch.Tensor]:
    """Write the backbone alone: mmpretrain names with mmengine's wrapper, or a bare timm
    state dict (DINO's format)."""
    if target == 'timm':
        if kind != 'vit':
            raise ConversionError(
                f'--target timm exports ViT backbones, but {checkpoint} holds an MST Swin '
                'backbone: use --target mmpretrain (or mmdet for Mask R-CNN).')
        exported = vit_to_timm(backbone)
        saved = exported  # a bare state dict, as DINO's released backbones
    else:
        exported = dict(backbone)
        meta = dict(source=osp.abspath(checkpoint), weights=weights, target=target,
                    epoch=loaded.get('meta', {}).get('epoch'),
                    iter=loaded.get('meta', {}).get('iter'))
        saved = dict(state_dict=exported, meta=meta)
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    torch.save(saved, out)
    print(f'Exported {len(exported)} tensors of the {weights} backbone (MST '
          f'{"Swin" if kind == "swin" else "ViT"}) with {BACKBONE_ONLY[target]}; dropped '
          f'{", ".join(PRETRAIN_ONLY_KEYS)} (pretraining only). Wrote {out}')
    return exported


def main(argv=None) -> Dict[str, torch.Tensor]:
    args = parse_args(argv)
    return convert(args.checkpoint, args.out, args.target, args.weights, args.config)


if __name__ == '__main__':
    run_tool(main)
