# Copyright (c) mst_mm contributors.
"""Turn a DINO checkpoint into one that an MST run starts from (``load_from``).

Examples::

    # DINO's ViT-S/16 backbone (the teacher, timm names) -> the DeiT-S recipe
    python tools/model_converters/dino2mst.py dino_deitsmall16_pretrain.pth \\
        pretrain/dino_deit-s_mst.pth
    python tools/train.py configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py \\
        --cfg-options load_from=pretrain/dino_deit-s_mst.pth
    # DINO's full checkpoint: student, teacher, head and centre; the head carries over into
    # a config whose neck has DINO's layout (no BN, K = 65,536)
    python tools/model_converters/dino2mst.py dino_deitsmall16_pretrain_full_checkpoint.pth \\
        pretrain/dino_deit-s_full_mst.pth \\
        --config configs/mst/mst-dino-head_deit-s-p16_8xb128-coslr-100e_in1k.py
    # DINO's ViT-B/16
    python tools/model_converters/dino2mst.py dino_vitbase16_pretrain.pth \\
        pretrain/dino_vit-b_mst.pth --config configs/mst/mst_vit-base-p16_8xb128-coslr-100e_in1k.py

Accepted: DINO's backbone-only files, DINO's full checkpoints (``student``, ``teacher``,
``dino_loss``; with or without DDP's ``module.``) and timm ViT state dicts of the config's
size (timm's classifier is dropped). The student and the teacher start from the file's
student and teacher, or both from its one network. Parts that DINO has no counterpart for
(the [MASK] token, the image decoder, and a neck whose layout differs from DINO's head) are
initialised as in a fresh run and named. The output holds every tensor of the config's
model, as the project's runner requires of ``load_from``; the run's epoch, optimiser and
schedules start fresh. Give the run the same ``--cfg-options`` that change the model.

The file is read weights-only (``mst_mm.engine.read_checkpoint``): a pickle that would run
code is refused before anything in it is used, and a truncated or unreadable file is named
with what is wrong with it. A backbone that does not fit the config is refused with its keys
and shapes. Every refusal ends the command with one message and exit status 2. The
conversion itself is the package's (``mst_mm.converters.dino``).
"""
import argparse
import os.path as osp
from typing import Dict

import torch

from mst_mm.converters import convert_dino_checkpoint
from mst_mm.utils.cli import add_cfg_options_argument, run_tool

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEFAULT_CONFIG = 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Convert a DINO checkpoint (facebookresearch/dino) into an MST checkpoint "
        'for `tools/train.py CONFIG --cfg-options load_from=OUT`.')
    parser.add_argument('checkpoint', help="DINO backbone-only file, DINO full checkpoint or "
                        'timm ViT state dict')
    parser.add_argument('out', help='where to write the MST checkpoint')
    parser.add_argument('--config', default=osp.join(REPO, DEFAULT_CONFIG),
                        help=f'the MST config of the run (default: {DEFAULT_CONFIG})')
    add_cfg_options_argument(parser)
    return parser.parse_args(argv)


def main(argv=None) -> Dict[str, torch.Tensor]:
    args = parse_args(argv)
    return convert_dino_checkpoint(args.checkpoint, args.out, args.config, args.cfg_options)


if __name__ == '__main__':
    run_tool(main)
