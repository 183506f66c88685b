"""The Quick-start demo: MST against its baselines on real textures, on a CPU, in minutes.

1. Writes 32 x 32 texture patches cut from images bundled with scikit-image
   (data/mst_demo/{train,val}/<class>/*.png, a quarter of every class held out).
2. Pretrains the tiny ViT of configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py four times
   through mmengine's Runner, the paper's Table 4 at demo scale: the DINO baseline (no mask,
   no decoder), then MST's decoder with no mask, with random masking at the same p, and with
   the attention-guided mask.
3. Prints weighted k-NN top-1 (T = 0.07) on the held-out split for raw pixels, the randomly
   initialised backbone and the pretrained teachers, with each run's last logged DINO loss,
   teacher entropy and teacher-student KL; with --seeds K every training is repeated and the
   table shows mean and standard deviation.
4. Writes attention / mask / reconstruction pictures of MST and a plot of the DINO loss,
   teacher entropy and KL of every run against ln K to WORK_DIR/pictures.

    python tools/demo.py [--seeds 3] [--epochs 30] [--work-dir work_dirs/mst_demo]

Every figure comes from this run. Train on your own folder by pointing --data-root at a
directory with train/<class>/*.png and val/<class>/*.png.
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import statistics
import sys
from typing import Dict, List

import numpy as np
import torch
from mmengine.config import Config

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PRETRAIN_CONFIG = osp.join(REPO, 'configs', 'mst', 'mst_vit-tiny-p4_1xb64-coslr-10e_demo.py')
KNN_CONFIG = osp.join(REPO, 'configs', 'benchmarks', 'knn', 'knn_vit-tiny_demo.py')
# (work-dir name, table row, model overrides of the demo config): the paper's Table 4 at
# demo scale, after the DINO baseline.
VARIANTS = [
    ('dino', 'DINO baseline (no mask, no decoder)',
     dict(mask_cfg=dict(mode='none'), decoder_head=None)),
    ('mst_mask_none', 'MST decoder, no mask', dict(mask_cfg=dict(mode='none'))),
    ('mst_random_mask', 'MST decoder, random mask (same p)', dict(mask_cfg=dict(mode='random'))),
    ('mst', 'MST decoder, attention-guided mask', dict()),
]
KS = (10, 20)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='MST Quick-start demo: the paper\'s Table 4 at demo scale, on a CPU.')
    parser.add_argument('--seeds', type=int, default=1,
                        help='repetitions of each training, seeds 0..N-1; the table then '
                        'shows mean and standard deviation (default: 1)')
    parser.add_argument('--epochs', type=int, default=None,
                        help='pretraining epochs of every variant, warm-ups scaled with them '
                        '(default: the config\'s, 10)')
    parser.add_argument('--batch-size', type=int, default=None,
                        help='pretraining batch size (default: the config\'s, 64)')
    parser.add_argument('--work-dir', default='work_dirs/mst_demo',
                        help='where the runs go: WORK_DIR/seed<S>/<variant>/epoch_<E>.pth '
                        '(variants: ' + ', '.join(name for name, _, _ in VARIANTS) + '), '
                        'WORK_DIR/knn_table.json and WORK_DIR/pictures/ '
                        '(default: work_dirs/mst_demo)')
    parser.add_argument('--data-root', default='data/mst_demo',
                        help='image folder with train/<class>/*.png and val/<class>/*.png; '
                        'the demo textures are written there unless it holds your own '
                        'images (default: data/mst_demo)')
    return parser.parse_args(argv)


def pretrain(variant: dict, seed: int, epochs, batch_size, data_root: str,
             work_dir: str) -> str:
    from mmengine.runner import Runner
    cfg = Config.fromfile(PRETRAIN_CONFIG)
    cfg.merge_from_dict(dict(model=variant))  # nested dicts merge, None replaces
    cfg.train_dataloader.dataset.data_root = osp.join(data_root, 'train')
    cfg.randomness = dict(seed=seed)
    cfg.work_dir = work_dir
    if epochs is not None:
        _set_epochs(cfg, epochs)
    if batch_size is not None:
        cfg.train_dataloader.batch_size = batch_size
    runner = Runner.from_cfg(cfg)
    runner.train()
    return osp.join(work_dir, f'epoch_{cfg.train_cfg.max_epochs}.pth')


def _set_epochs(cfg: Config, epochs: int) -> None:
    """Shorten the whole schedule, warm-ups included, proportionally."""
    old = cfg.train_cfg.max_epochs
    scale = epochs / old
    cfg.train_cfg.max_epochs = epochs
    for scheduler in cfg.param_scheduler:
        scheduler.begin = round(scheduler.begin * scale)
        scheduler.end = max(round(scheduler.end * scale), scheduler.begin + 1)
    for hook in cfg.custom_hooks:
        if hook.type == 'TeacherTempWarmupHook':
            hook.warmup_epochs = max(1, round(hook.warmup_epochs * scale))
    cfg.default_hooks.checkpoint.interval = epochs


def knn_of_checkpoint(checkpoint: str, weights: str, data_root: str, work_dir: str) -> dict:
    from mmengine.runner import Runner
    cfg = Config.fromfile(KNN_CONFIG)
    cfg.model.weights = weights
    cfg.load_from = checkpoint
    cfg.work_dir = work_dir
    cfg.test_dataloader.dataset.data_root = osp.join(data_root, 'val')
    cfg.test_cfg.train_dataloader.dataset.data_root = osp.join(data_root, 'train')
    cfg.test_evaluator.ks = KS
    metrics = Runner.from_cfg(cfg).test()
    return {k: metrics[f'knn/top1_k{k}'] for k in KS}


def random_init_checkpoint(seed: int, path: str) -> str:
    from mmengine.logging import MMLogger
    from mmengine.runner import set_random_seed
    from mmpretrain.registry import MODELS
    set_random_seed(seed)
    os.makedirs(osp.dirname(path), exist_ok=True)
    # Outside a Runner, mmengine's init_weights prints every parameter's initialisation to
    # the console (hundreds of lines); with a log file as the current logger it writes
    # them there instead, as in a training run.
    MMLogger.get_instance(f'mst_demo_init_seed{seed}', log_file=osp.splitext(path)[0] + '.log')
    model = MODELS.build(Config.fromfile(PRETRAIN_CONFIG).model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict()}, path)
    return path


def raw_pixel_knn(data_root: str) -> dict:
    from mmcv import imread, imresize

    from mst_mm.evaluation import knn_top1

    def load(split):
        paths = sorted(glob.glob(osp.join(data_root, split, '*', '*.png')))
        if not paths:
            raise FileNotFoundError(f'No PNG images under {osp.join(data_root, split)}/<class>/.')
        classes = sorted({osp.basename(osp.dirname(p)) for p in paths})
        # The demo's patches are 32 x 32 already; other images are resized to that.
        feats = torch.tensor(np.stack([imresize(imread(p), (32, 32)).reshape(-1)
                                       for p in paths]), dtype=torch.float32)
        labels = torch.tensor([classes.index(osp.basename(osp.dirname(p))) for p in paths])
        return feats, labels

    return knn_top1(*load('train'), *load('val'), ks=KS)


def summarise(values: List[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f'{values[0]:.{digits}f}'
    return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def main(argv=None) -> Dict[str, Dict]:
    args = parse_args(argv)
    import mst_mm  # noqa: F401
    from mst_mm.datasets import write_demo_dataset
    from mst_mm.visualization import final_values, plot_dino_curves, read_scalars

    if osp.isdir(osp.join(args.data_root, 'train')) and not osp.isfile(
            osp.join(args.data_root, 'dataset.json')):
        print(f'using your images in {args.data_root}/{{train,val}}')
    else:
        summary = write_demo_dataset(args.data_root)
        print(f"demo data: {summary['train']} train / {summary['val']} held-out 32x32 "
              f"patches of {', '.join(summary['classes'])} (scikit-image)")
    results: Dict[str, Dict] = {}

    def record(row: str, values: dict) -> None:
        for key, value in values.items():
            results.setdefault(row, {}).setdefault(key, []).append(value)

    record('raw pixels', raw_pixel_knn(args.data_root))
    curves: Dict[str, List[List[dict]]] = {}
    last_mst = None
    for seed in range(args.seeds):
        seed_dir = osp.join(args.work_dir, f'seed{seed}')
        init = random_init_checkpoint(seed, osp.join(args.work_dir, f'init_seed{seed}.pth'))
        record('random init', knn_of_checkpoint(init, 'student', args.data_root, seed_dir))
        for name, row, variant in VARIANTS:
            run_dir = osp.join(seed_dir, name)
            ckpt = pretrain(variant, seed, args.epochs, args.batch_size, args.data_root, run_dir)
            record(row, knn_of_checkpoint(ckpt, 'teacher', args.data_root, run_dir))
            rows = read_scalars(run_dir)
            curves.setdefault(row, []).append(rows)
            record(row, final_values(rows))
            if name == 'mst':
                last_mst = ckpt

    pictures = write_pictures(last_mst, args.data_root, osp.join(args.work_dir, 'pictures'))
    num_prototypes = Config.fromfile(PRETRAIN_CONFIG).model.head.out_channels
    plot = plot_dino_curves(
        curves, num_prototypes, osp.join(args.work_dir, 'pictures', 'dino_curves.png'),
        title=f'demo pretraining, {args.seeds} seed(s) per variant')
    print_table(results, args.seeds, num_prototypes)
    with open(osp.join(args.work_dir, 'knn_table.json'), 'w') as f:
        json.dump(results, f, indent=2)
    print(f'\nk-NN results: {osp.join(args.work_dir, "knn_table.json")}')
    print(f'pictures (attention, masks, reconstruction): {pictures}')
    print(f'curves (DINO loss, teacher entropy, KL against ln K): {plot}')
    print(f'checkpoints: {osp.join(args.work_dir, "seed<S>", "<variant>", osp.basename(last_mst))}'
          f' (e.g. {last_mst})')
    return results


def write_pictures(checkpoint: str, data_root: str, out: str) -> str:
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'visualize_mst', osp.join(REPO, 'tools', 'analysis', 'visualize_mst.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    images = [sorted(glob.glob(osp.join(data_root, 'val', c, '*.png')))[0]
              for c in sorted(os.listdir(osp.join(data_root, 'val')))]
    return tool.main([PRETRAIN_CONFIG, checkpoint, *images, '--out-dir', out, '--grid'])[-1]


def print_table(results: Dict[str, Dict], seeds: int, num_prototypes: int) -> None:
    spread = f' (mean ± std over {seeds} seeds)' if seeds > 1 else ''
    print(f'\nweighted k-NN top-1 (%) on the held-out quarter, T = 0.07, and the last '
          f'logged DINO loss, teacher entropy H and teacher-student KL (ln K = '
          f'{math.log(num_prototypes):.3f}){spread}')
    columns = [(k, f'k = {k}', 1) for k in KS] + [
        ('loss_dino', 'loss_dino', 3), ('teacher_entropy', 'H(P_t)', 3),
        ('teacher_student_kl', 'KL', 3)]
    print('| features | ' + ' | '.join(title for _, title, _ in columns) + ' |')
    print('| --- | ' + ' | '.join('---' for _ in columns) + ' |')
    for row, values in results.items():
        cells = [summarise(values[key], digits) if key in values else '-'
                 for key, _, digits in columns]
        print(f'| {row} | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
    main()
