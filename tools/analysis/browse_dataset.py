"""A picture of the multi-crop views of a pretraining config's first images, as the model
sees them in training (mmpretrain's tools/visualization/browse_dataset.py, for MST's views):
one row per image, its views left to right, the global views first. Look at your own images
this way before a long run.

    python tools/analysis/browse_dataset.py configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py \
        --cfg-options train_dataloader.dataset.data_root=/path/to/my_images \
        --out work_dirs/views.png --num-images 4

The views are what a training step gets: the dataset's pipeline (the data workers' part),
then the model's data preprocessor in training mode, on the CPU (the batched flip, jitter,
grey, blur and solarisation of BatchViewAugment, or BatchMultiCrop's crops as well, where the
config puts them there), with the normalisation undone.
"""
import argparse
import os
import os.path as osp

from mmengine.config import Config

from mst_mm.utils.cli import add_cfg_options_argument, merge_cfg_options, run_tool


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Picture of a config's multi-crop views")
    parser.add_argument('config', help='a pretraining config')
    parser.add_argument('--out', default='work_dirs/multicrop_views.png',
                        help='the PNG to write (default: work_dirs/multicrop_views.png)')
    parser.add_argument('--num-images', type=int, default=4,
                        help="rows: the first N images of the training dataset (default: 4)")
    parser.add_argument('--seed', type=int, default=0, help='seed of the random views')
    parser.add_argument('--zoom', type=int, help='whole-number magnification of every view '
                        '(default: enough to draw a global view at least 128 px tall)')
    add_cfg_options_argument(parser)
    args = parser.parse_args(argv)
    if args.num_images < 1:
        parser.error(f'--num-images must be at least 1, got {args.num_images}')
    if args.zoom is not None and args.zoom < 1:
        parser.error(f'--zoom must be at least 1, got {args.zoom}')
    if not args.out.lower().endswith('.png'):
        parser.error(f'--out is a PNG file (FILE.png), got {args.out!r}')
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    import mmcv

    from mst_mm.visualization import default_zoom, multicrop_views, views_grid

    cfg = merge_cfg_options(Config.fromfile(args.config), args.cfg_options)
    views = multicrop_views(cfg, num_images=args.num_images, seed=args.seed)
    grid = views_grid(views, zoom=args.zoom or default_zoom(views))
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    mmcv.imwrite(mmcv.rgb2bgr(grid), args.out)
    sizes = ', '.join(f'{v.shape[2]} x {v.shape[1]}' for v in views)
    print(f'wrote {args.out}: {args.num_images} images x {len(views)} views ({sizes} px)')
    return args.out


if __name__ == '__main__':
    run_tool(main)
