# Copyright (c) mst_mm contributors.
"""Turn an MST training checkpoint into a backbone checkpoint for mmdet, mmseg, mmpretrain
or timm, or into DINO's full-checkpoint layout.

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
    # DINO's full-checkpoint layout (student, teacher, head, centre) for DINO's own tools:
    # python eval_knn.py --pretrained_weights mst_deit-s_dino.pth --checkpoint_key teacher
    python tools/model_converters/mst2downstream.py CKPT mst_deit-s_dino.pth --target dino

For mmdet and mmseg the keys are checked one by one against the backbone that the
downstream config builds (``--config``, by default ours under ``configs/benchmarks/``),
because mmdet and mmseg load pretrained backbones with ``strict=False`` and say nothing
about keys that did not match. Anything that is not an exact match is refused, with the
keys named. The checkpoint is read weights-only (``mst_mm.engine.read_checkpoint``), so a
pickle that would run code is refused before anything in it is used, and a truncated or
unreadable file is named with what is wrong with it. Every refusal ends the command with
one message and exit status 2. The conversion itself is the package's
(``mst_mm.converters.downstream``).
"""
import argparse
import os
import os.path as osp
from typing import Dict

import torch

from mst_mm.converters import (
    backbone_kind,
    convert_for_downstream,
    extract_backbone,
    mst_to_dino,
    read_training_checkpoint,
    vit_to_timm,
)
from mst_mm.converters.downstream import DOWNSTREAM_TARGETS
from mst_mm.errors import UserInputError
from mst_mm.models.algorithms.mst import BACKBONE_PREFIXES, PRETRAIN_ONLY_KEYS
from mst_mm.utils.cli import run_tool

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# The default downstream config of each target (--config overrides it).
TARGETS = {
    'mmdet': dict(
        DOWNSTREAM_TARGETS['mmdet'],
        config='configs/benchmarks/mmdetection/mask-rcnn_mst-swin-t-p4-w7_fpn_1x_coco.py'),
    'mmseg': dict(
        DOWNSTREAM_TARGETS['mmseg'],
        config='configs/benchmarks/mmsegmentation/'
        'setr_mst-deit-s_naive_8xb1-40k_cityscapes-768x768.py'),
}
# Backbone-only exports: no downstream config to match, the names are the point.
BACKBONE_ONLY = {
    'mmpretrain': "mmpretrain's backbone names (MaskViT / VisionTransformer, MaskSwin / "
                  'SwinTransformer)',
    'timm': "timm's VisionTransformer names (DeiT-S: vit_small_patch16_224)",
}
# Both networks, backbone and head, in the layout of DINO's full checkpoints.
DINO_FORMAT = 'dino'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Convert an MST checkpoint into an mmdet / mmseg backbone checkpoint.')
    parser.add_argument('checkpoint', help='MST training checkpoint (as tools/train.py saves)')
    parser.add_argument('out', help='where to write the backbone checkpoint')
    parser.add_argument('--target', required=True,
                        choices=sorted({*TARGETS, *BACKBONE_ONLY, DINO_FORMAT}),
                        help='mmdet (Swin-T, Mask R-CNN) or mmseg (ViT, SETR): a checkpoint '
                        'checked against the downstream config\'s backbone; mmpretrain: the '
                        'backbone alone with mmpretrain\'s names; timm: the ViT backbone '
                        'alone with timm\'s names, as DINO ships its weights; dino: student '
                        'and teacher, backbone and head, and the centre, as DINO\'s full '
                        'checkpoints (for DINO\'s eval_knn.py / eval_linear.py with '
                        '--checkpoint_key teacher)')
    parser.add_argument('--weights', default='teacher', choices=sorted(BACKBONE_PREFIXES),
                        help='the EMA teacher (default, as DINO evaluates) or the student '
                        '(--target dino writes both)')
    parser.add_argument('--config', help='mmdet / mmseg: downstream config whose backbone '
                        'the keys must match (default: ours for the target under '
                        'configs/benchmarks/)')
    return parser.parse_args(argv)


def convert(checkpoint: str, out: str, target: str, weights: str = 'teacher',
            config: str = None) -> Dict[str, torch.Tensor]:
    """Convert ``checkpoint`` and write ``out``; returns the converted backbone tensors (the
    teacher's network, backbone and head, for ``--target dino``)."""
    if target == DINO_FORMAT:
        return export_dino(checkpoint, out)
    if target in BACKBONE_ONLY:
        loaded = read_training_checkpoint(checkpoint, out)
        backbone = extract_backbone(loaded['state_dict'], weights, checkpoint)
        kind = backbone_kind(backbone)
        return export_backbone_only(backbone, kind, loaded, checkpoint, out, target, weights)
    config = config or osp.join(REPO, TARGETS[target]['config'])
    return convert_for_downstream(checkpoint, out, target, config, weights)


def export_dino(checkpoint: str, out: str) -> Dict[str, torch.Tensor]:
    """Write both networks in the layout of DINO's full checkpoints (``mst_to_dino``)."""
    loaded = read_training_checkpoint(checkpoint, out)
    saved = mst_to_dino(loaded['state_dict'], checkpoint)
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    torch.save(saved, out)
    print(f'Exported student and teacher ({len(saved["teacher"])} tensors each: backbone with '
          "timm's names, DINO's head) and the centre in the layout of DINO's full "
          f'checkpoints; dropped {", ".join(PRETRAIN_ONLY_KEYS)} and the image decoder '
          f'(MST only). Wrote {out}; DINO reads it with --pretrained_weights {out} '
          '--checkpoint_key teacher.')
    return saved['teacher']


def export_backbone_only(backbone: Dict[str, torch.Tensor], kind: str, loaded: dict,
                         checkpoint: str, out: str, target: str,
                         weights: str) -> Dict[str, torch.Tensor]:
    """Write the backbone alone: mmpretrain names with mmengine's wrapper, or a bare timm
    state dict (DINO's format)."""
    if target == 'timm':
        if kind != 'vit':
            raise UserInputError(
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
