"""Frozen patch-feature probe of a checkpoint: patch-grid and pixel mIoU, as a table (and JSON).

    python projects/mst_research/tools/patch_probe.py \
        configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py CKPT \
        --data-root data/animal_shapes/objects [--raw-pixels] [--out probe.json]
    # choosing the probe's settings: the validation images carved from the training images
    python projects/mst_research/tools/patch_probe.py CONFIG CKPT --data-root DIR --validation \
        --optimizer sgd --lr 0.1 --epochs 20

CONFIG is the MST pretraining config whose ``model.backbone`` (a ViT) the checkpoint fits and
whose data preprocessor normalises the images. CKPT is an MST training checkpoint (teacher
weights by default), a checkpoint with ``backbone.*`` keys, or a backbone alone
(``mst2downstream.py --target mmpretrain``), loaded weights-only, every weight required. DIR
holds the object images with their masks as ``write_animal_shapes.py`` (beside this tool)
writes them under ``objects/`` (the evidence data root is accepted too);
``mst_research.patch_probe`` says how the probe trains and scores.
"""
import argparse
import json
import os
import os.path as osp

from mmengine.config import Config

from mst_mm.errors import CheckpointError, UserInputError
from mst_mm.utils.cli import add_cfg_options_argument, merge_cfg_options, run_tool
from mst_research import patch_probe


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Frozen patch-feature probe (mIoU)')
    parser.add_argument('config', help='the MST pretraining config of the checkpoint')
    parser.add_argument('checkpoint', help='checkpoint to probe')
    parser.add_argument('--data-root', required=True, metavar='DIR',
                        help='images with masks: DIR/{train,test}/<class>/*.png and '
                        'DIR/{train,test}_masks.npz (or DIR/objects/ holding them)')
    parser.add_argument('--weights', choices=['teacher', 'student'], default='teacher',
                        help='which backbone of an MST training checkpoint (default: teacher)')
    parser.add_argument('--raw-pixels', action='store_true',
                        help='also probe the raw pixels of each patch (the baseline row)')
    parser.add_argument('--validation', action='store_true',
                        help='train on the training images less 100 a class, and score on '
                        'those 100 a class (for choosing the settings; the test images are '
                        'not read)')
    d = patch_probe.DEFAULT_SETTINGS
    parser.add_argument('--optimizer', choices=patch_probe.OPTIMIZERS, default=d['optimizer'],
                        help=f'default: {d["optimizer"]}')
    parser.add_argument('--epochs', type=int, default=d['epochs'],
                        help='passes over the training patches (lbfgs: iterations) '
                        f'(default: {d["epochs"]})')
    parser.add_argument('--lr', type=float, default=d['lr'],
                        help='default: the optimiser\'s, ' + ', '.join(
                            f'{k} {v}' for k, v in patch_probe.DEFAULT_LR.items()))
    parser.add_argument('--weight-decay', type=float, default=d['weight_decay'],
                        help=f'default: {d["weight_decay"]}')
    parser.add_argument('--batch-size', type=int, default=d['batch_size'],
                        help=f'patches per step of adamw and sgd (default: {d["batch_size"]})')
    parser.add_argument('--normalize', choices=patch_probe.NORMALIZATIONS,
                        default=d['normalize'], help='standardize: each channel by the '
                        'training patches\' mean and std; none: as they are (default: '
                        f'{d["normalize"]})')
    parser.add_argument('--seed', type=int, default=d['seed'])
    parser.add_argument('--out', metavar='FILE.json', help='write the results as a JSON file')
    add_cfg_options_argument(parser)
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.endswith('.json'):
        parser.error(f'--out is a JSON file (FILE.json), got {args.out!r}')
    return args


def objects_root(data_root: str) -> str:
    """DIR itself, or DIR/objects when DIR is the evidence data root."""
    for root in (data_root, osp.join(data_root, 'objects')):
        if osp.isfile(osp.join(root, 'train_masks.npz')):
            return root
    raise UserInputError(f'--data-root {data_root} has no train_masks.npz (nor objects/'
                         'train_masks.npz): write the images with their masks, python '
                         f'projects/mst_research/tools/write_animal_shapes.py {data_root}')


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise CheckpointError(f'Checkpoint {args.checkpoint} does not exist.')
    cfg = Config.fromfile(args.config)
    merge_cfg_options(cfg, args.cfg_options)
    settings = {key: getattr(args, key) for key in patch_probe.DEFAULT_SETTINGS}
    train, test = patch_probe.masked_splits(objects_root(args.data_root), args.validation)
    backbone = patch_probe.load_frozen_backbone(cfg.model.backbone, args.checkpoint, args.weights)
    pre = cfg.model.data_preprocessor
    rows = {}
    if args.raw_pixels:
        rows['raw_pixels'] = patch_probe.probe_patches(
            train, test, patch_size=cfg.model.backbone.patch_size, **settings)
    rows[osp.basename(args.checkpoint)] = patch_probe.probe_patches(
        train, test, backbone, pre.mean, pre.std, **settings)
    used = next(iter(rows.values()))['settings']   # with the optimiser's lr filled in
    print(f'\nfrozen patch probe, {len(train.classes)} training / {len(test.classes)} '
          f"{'validation' if args.validation else 'test'} images, {args.weights} weights, "
          + ', '.join(f'{k} {v}' for k, v in used.items()))
    print('| features | patch mIoU (%) | pixel mIoU (%) |\n| --- | --- | --- |')
    for name, row in rows.items():
        print(f"| {name} | {row['patch_miou']:.2f} | {row['pixel_miou']:.2f} |")
    result = dict(checkpoint=args.checkpoint, weights=args.weights,
                  split='validation' if args.validation else 'test', rows=rows)
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    run_tool(main)
