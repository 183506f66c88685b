"""Pictures of what an MST checkpoint sees: one PNG row per image with the input, the
teacher's last-layer CLS attention (mean and per head) laid over the image with a colour
bar, the attention-guided mask (candidates outlined, masked patches filled and hatched)
against a random mask at the same p, and the decoder's reconstruction. Each row is named
by the image's folder (its class in a class-folder dataset) unless --labels says otherwise.

    python tools/analysis/visualize_mst.py configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py \
        work_dirs/mst_demo/pretrain/mst_guided_mask_seed0/epoch_6.pth \
        data/animal_shapes/objects/test/cat/*.png \
        --out-dir work_dirs/pictures --grid
"""
import argparse
import os
import os.path as osp
import sys
import warnings

import mmcv
import torch
from mmengine.config import Config

from mst_mm.converters import load_model
from mst_mm.visualization import load_image, mst_picture_row, render_rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='MST attention, mask and reconstruction')
    parser.add_argument('config', help='the MST pretraining config of the checkpoint')
    parser.add_argument('checkpoint', help='MST training checkpoint')
    parser.add_argument('images', nargs='+', help='image files')
    parser.add_argument('--out-dir', help='output directory for the PNGs')
    parser.add_argument('--out', help='deprecated name of --out-dir (the other tools use '
                        '--out for a JSON file)')
    parser.add_argument('--labels', nargs='+', help='one name per image, drawn left of its '
                        "row (default: the image's folder name, i.e. its class in a "
                        "class-folder dataset; 'none' for no names)")
    parser.add_argument('--size', type=int, help='resize images to this (default: the '
                        "backbone's img_size)")
    parser.add_argument('--max-heads', type=int, default=6,
                        help='attention heads drawn at most (default: 6)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the two masks')
    parser.add_argument('--grid', action='store_true', help='also write all rows in one PNG')
    args = parser.parse_args(argv)
    if args.out is not None:
        if args.out_dir is not None:
            parser.error('give --out-dir only (--out is its deprecated name)')
        warnings.warn('visualize_mst.py: --out is deprecated, use --out-dir (a directory; '
                      'knn_eval.py and benchmark.py use --out for a JSON file).',
                      DeprecationWarning, stacklevel=2)
        print('warning: --out is deprecated, use --out-dir', file=sys.stderr)
        args.out_dir = args.out
    if args.out_dir is None:
        parser.error('--out-dir is required (the directory the PNGs go to)')
    if args.labels is not None and args.labels != ['none'] and len(args.labels) != len(
            args.images):
        parser.error(f'--labels needs one name per image: {len(args.images)} images, '
                     f'{len(args.labels)} labels')
    return args


def row_labels(images: list, labels: list = None) -> list:
    """The name of each image's row: ``labels`` if given (``['none']``: no names), else the
    image's parent folder name (the class in a class-folder dataset)."""
    if labels == ['none']:
        return [None] * len(images)
    if labels:
        return list(labels)
    return [osp.basename(osp.dirname(osp.abspath(path))) for path in images]


def output_names(images: list) -> list:
    """``<stem>_mst.png`` per image; ``<folder>_<stem>_mst.png`` where stems repeat (e.g.
    ``0.png`` in several class folders), so no picture overwrites another."""
    stems = [osp.splitext(osp.basename(path))[0] for path in images]
    names = [stem if stems.count(stem) == 1 else
             f'{osp.basename(osp.dirname(osp.abspath(path)))}_{stem}'
             for stem, path in zip(stems, images)]
    return [f'{name}_mst.png' if names.count(name) == 1 else f'{name}_{i}_mst.png'
            for i, name in enumerate(names)]


def main(argv=None) -> list:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    model = load_model(cfg, args.checkpoint)  # weights-only, strict
    size = args.size or cfg.model.backbone.img_size
    os.makedirs(args.out_dir, exist_ok=True)
    written, rows = [], []
    labels = row_labels(args.images, args.labels)
    names = output_names(args.images)
    for i, (path, label) in enumerate(zip(args.images, labels)):
        row = mst_picture_row(model, load_image(path, size, model),
                              generator=torch.Generator().manual_seed(args.seed + i),
                              label=label)
        rows.append(row)
        out = osp.join(args.out_dir, names[i])
        mmcv.imwrite(mmcv.rgb2bgr(render_rows([row], max_heads=args.max_heads)), out)
        written.append(out)
    if args.grid:
        out = osp.join(args.out_dir, 'mst_pictures.png')
        mmcv.imwrite(mmcv.rgb2bgr(render_rows(rows, max_heads=args.max_heads)), out)
        written.append(out)
    print('wrote ' + ', '.join(written))
    return written


if __name__ == '__main__':
    main()
