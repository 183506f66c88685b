"""Pictures of what an MST checkpoint sees: one PNG row per image with the input, the
teacher's last-layer CLS attention (mean and per head), the attention-guided mask (light:
the lowest-1/num candidates, dark: masked) against a random mask at the same p, and the
decoder's reconstruction.

    python tools/analysis/visualize_mst.py configs/mst_vit-tiny_demo.py \
        work_dirs/mst_demo/epoch_30.pth data/mst_demo/val/brick/*.png --out work_dirs/pictures
"""
import argparse
import os
import os.path as osp
import sys

import mmcv
import numpy as np
import torch
from mmengine.config import Config
from mmengine.runner import load_checkpoint

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='MST attention, mask and reconstruction')
    parser.add_argument('config', help='the MST pretraining config of the checkpoint')
    parser.add_argument('checkpoint', help='MST training checkpoint')
    parser.add_argument('images', nargs='+', help='image files')
    parser.add_argument('--out', required=True, help='output directory for the PNGs')
    parser.add_argument('--size', type=int, help='resize images to this (default: the '
                        "backbone's img_size)")
    parser.add_argument('--seed', type=int, default=0, help='seed of the two masks')
    parser.add_argument('--grid', action='store_true', help='also write all rows in one PNG')
    return parser.parse_args(argv)


def load_image(path: str, size: int, model) -> torch.Tensor:
    """RGB, resized to size x size, normalised as the training preprocessor does."""
    try:
        img = mmcv.imread(path, channel_order='rgb')
    except Exception as e:  # mmcv raises several types for unreadable files
        raise ValueError(f'Cannot read image {path}: {e}') from e
    if img is None:
        raise ValueError(f'Cannot read image {path}: not an image file.')
    img = mmcv.imresize(img, (size, size), interpolation='bicubic', backend='pillow')
    tensor = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float()
    pre = model.data_preprocessor
    return (tensor - pre.mean.reshape(3, 1, 1)) / pre.std.reshape(3, 1, 1)


def main(argv=None) -> list:
    args = parse_args(argv)
    from mmpretrain.registry import MODELS

    import mst_mm  # noqa: F401  registers MST and the weights-only allow-list
    from mst_mm.visualization import mst_picture_row, render_rows

    cfg = Config.fromfile(args.config)
    model = MODELS.build(cfg.model)
    load_checkpoint(model, args.checkpoint, map_location='cpu', strict=True)
    size = args.size or cfg.model.backbone.img_size
    os.makedirs(args.out, exist_ok=True)
    written, rows = [], []
    for i, path in enumerate(args.images):
        row = mst_picture_row(model, load_image(path, size, model),
                              generator=torch.Generator().manual_seed(args.seed + i))
        rows.append(row)
        out = osp.join(args.out, osp.splitext(osp.basename(path))[0] + '_mst.png')
        mmcv.imwrite(mmcv.rgb2bgr(render_rows([row])), out)
        written.append(out)
    if args.grid:
        out = osp.join(args.out, 'mst_pictures.png')
        mmcv.imwrite(mmcv.rgb2bgr(render_rows(rows)), out)
        written.append(out)
    print('wrote ' + ', '.join(written))
    return written


if __name__ == '__main__':
    main()
