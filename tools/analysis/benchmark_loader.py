"""What the 224-px pretraining input costs: a data worker's CPU time per image against DINO's
reference pipeline, the batched device-side part, and the loader's images/s with N workers.

    python tools/analysis/benchmark_loader.py --reference-dino /path/to/dino
    python tools/analysis/benchmark_loader.py --workers 8 15 --batch-size 128   # a GPU node

Per image, in one process with one thread, as a data worker runs (``--reference-dino``):

- ``ours``: the DeiT-S config's worker pipeline (decode, then cut and resize the ten crops:
  ``MultiCrop(crops_only=True)``, then ``PackInputs``);
- ``ours_per_image``: the same views made whole in the worker (``MultiCrop``, every
  augmentation per image): what the configs ran before;
- ``dino``: DINO's ``pil_loader`` and ``DataAugmentationDINO`` (2 x 224 + 8 x 96), imported
  from a clone at run time.

Each repetition passes every pipeline over the same JPEGs, in a rotating order; a figure is
the median CPU time (user + system) per image, with the range over the repetitions, and a
ratio is taken inside each repetition. ``device_side`` is what the model's data preprocessor
(``BatchViewAugment`` and the normalisation) then costs per image on this machine's device.
``--workers`` times a real DataLoader of the config over the JPEGs. The JPEGs are crops of
scikit-image's bundled photographs saved at an average ImageNet size, 500 x 375.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from benchmark import (  # noqa: E402
    git_commit,
    import_reference_dino,
    interleaved_times,
    load_per_core,
    machine,
    ratio_over_repetitions,
)

CONFIG = 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'
PHOTO_SIZE = (500, 375)  # width, height: ImageNet's average photo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--config', default=CONFIG, help='the pretraining config whose '
                        'train pipeline and data preprocessor are timed')
    parser.add_argument('--reference-dino', metavar='DIR',
                        help='a facebookresearch/dino clone: time DataAugmentationDINO too')
    parser.add_argument('--images', type=int, default=48,
                        help='JPEGs per repetition of the per-image timings')
    parser.add_argument('--repeats', type=int, default=7, help='timed repetitions')
    parser.add_argument('--workers', type=int, nargs='*', default=[],
                        help='time a DataLoader with each number of workers (images/s)')
    parser.add_argument('--batch-size', type=int, default=128,
                        help='images per batch of the DataLoader and the device-side part')
    parser.add_argument('--batches', type=int, default=10,
                        help='timed DataLoader batches per number of workers (after one)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help="where the device-side part runs")
    parser.add_argument('--photos', default='work_dirs/benchmark_loader/photos',
                        help='folder of the JPEGs (written once)')
    parser.add_argument('--out', default='work_dirs/benchmark_loader/loader.json',
                        help='JSON file of every figure')
    return parser


def write_photos(folder: str, num_images: int) -> List[str]:
    """``num_images`` ImageNet-sized JPEGs in ``folder`` (kept when already there)."""
    from mst_mm.evidence.bundled_photos import write_photo_crops
    width, height = PHOTO_SIZE
    write_photo_crops(folder, num_images=num_images, size=width, height=height, seed=0)
    return sorted(osp.join(folder, name) for name in os.listdir(folder)
                  if name.endswith('.jpg'))


def worker_pipelines(cfg: Config, dino_dir: Optional[str]) -> Dict[str, Callable]:
    """Each pipeline as a function of one image path."""
    from mmcv.transforms import Compose
    from mmengine.registry import DefaultScope

    import mst_mm  # noqa: F401  (registers the transforms)

    def compose(pipeline: list) -> Callable:
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            transform = Compose(pipeline)
        return lambda path: transform(dict(img_path=path))

    pipeline = cfg.train_dataloader.dataset.pipeline
    whole = [dict(t, crops_only=False) if t['type'] == 'MultiCrop' else t for t in pipeline]
    fns = dict(ours=compose(pipeline), ours_per_image=compose(whole))
    if dino_dir:
        from PIL import Image

        main_dino = import_reference_dino(dino_dir)['main_dino']
        augment = main_dino.DataAugmentationDINO((0.4, 1.0), (0.05, 0.4), 8)

        def dino(path: str) -> list:
            with open(path, 'rb') as f:  # torchvision's pil_loader, as DINO's ImageFolder
                return augment(Image.open(f).convert('RGB'))
        fns['dino'] = dino
    return fns


def per_image_cpu_ms(fns: Dict[str, Callable], paths: List[str], repeats: int) -> dict:
    """Median and range of the CPU milliseconds per image of each pipeline, and the ratio of
    every pipeline to ``ours`` inside each repetition."""
    over_images = {name: (lambda fn=fn: [fn(p) for p in paths]) for name, fn in fns.items()}
    _, usage = interleaved_times(over_images, repeats, warmup=1, device='cpu')
    cpu = {name: [1000 * (u['user'] + u['system']) / len(paths) for u in reps]
           for name, reps in usage.items()}
    figures = {name: dict(median=statistics.median(ms), min=min(ms), max=max(ms), all=ms)
               for name, ms in cpu.items()}
    ratios = {}
    for name in cpu:
        if name != 'ours':
            ratio, (low, high) = ratio_over_repetitions(cpu[name], cpu['ours'])
            ratios[f'{name}_over_ours'] = dict(median=ratio, min=low, max=high)
    return dict(cpu_ms_per_image=figures, ratios=ratios)


def device_side_ms(cfg: Config, fn: Callable, paths: List[str], batch_size: int,
                   device: str, repeats: int) -> dict:
    """Milliseconds per image of the model's data preprocessor in training (the batched
    augmentations and the normalisation) on ``device``, over a batch of worker outputs."""
    from mmengine.dataset import default_collate
    from mmpretrain.registry import MODELS

    preprocessor = MODELS.build(cfg.model.data_preprocessor).to(device)
    samples = [fn(paths[i % len(paths)]) for i in range(batch_size)]
    batch = default_collate(samples)
    times, _ = interleaved_times({'device_side': lambda: preprocessor(batch, training=True)},
                                 repeats, warmup=1, device=device)
    ms = [1000 * t / batch_size for t in times['device_side']]
    return dict(device=device, batch_size=batch_size, median=statistics.median(ms),
                min=min(ms), max=max(ms), all=ms)


def loader_images_per_second(cfg: Config, folder: str, workers: int, batch_size: int,
                             batches: int) -> dict:
    """Images/s of the config's DataLoader over ``folder`` with ``workers`` workers, timed
    over ``batches`` batches after the first (which waits for the workers to start)."""
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    loader_cfg = cfg.train_dataloader.copy()
    loader_cfg.update(batch_size=batch_size, num_workers=workers,
                      persistent_workers=False, pin_memory=torch.cuda.is_available())
    loader_cfg.dataset = dict(loader_cfg.dataset, data_root=folder, data_layout='flat')
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmpretrain')):
        loader = Runner.build_dataloader(loader_cfg, seed=0)
    batches_iter = iter(loader)
    next(batches_iter)
    start = time.perf_counter()
    for _ in range(batches):
        next(batches_iter)
    seconds = time.perf_counter() - start
    del batches_iter
    return dict(workers=workers, batch_size=batch_size, batches=batches,
                images_per_second=batches * batch_size / seconds)


def markdown_rows(results: dict) -> List[str]:
    """The per-image table of docs/benchmarks.md, rendered from a run's results."""
    per_image, device = results['per_image'], results['device_side']
    rows = ['| pipeline | CPU ms per image | DINO / this |', '| --- | --- | --- |']
    names = dict(ours='workers cut the crops (this code)',
                 ours_per_image='workers make the views whole (before)',
                 dino="DINO's DataAugmentationDINO")
    for name, fig in per_image['cpu_ms_per_image'].items():
        ratio = per_image['ratios'].get('dino_over_ours') if name == 'ours' else None
        cell = (f'{ratio["median"]:.2f} ({ratio["min"]:.2f}-{ratio["max"]:.2f})'
                if ratio else '')
        rows.append(f'| {names[name]} | {fig["median"]:.2f} ({fig["min"]:.2f}-{fig["max"]:.2f}) '
                    f'| {cell} |')
    rows.append(f'| device side ({device["device"]}, batch {device["batch_size"]}) '
                f'| {device["median"]:.2f} ({device["min"]:.2f}-{device["max"]:.2f}) | |')
    return rows


def print_tables(results: dict) -> None:
    print('\n'.join(markdown_rows(results)))
    for name, ratio in results['per_image']['ratios'].items():
        print(f'{name}: {ratio["median"]:.2f} ({ratio["min"]:.2f}-{ratio["max"]:.2f})')
    for row in results.get('loader', []):
        print(f'loader, {row["workers"]} workers, batch {row["batch_size"]}: '
              f'{row["images_per_second"]:.0f} images/s')


def main(argv: Optional[List[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    os.chdir(REPO)
    cfg = Config.fromfile(args.config)
    needed = max(args.images, args.batch_size * (args.batches + 1) if args.workers else 0)
    paths = write_photos(args.photos, needed)
    results = dict(command=' '.join(['python', 'tools/analysis/benchmark_loader.py']
                                    + (argv if argv is not None else sys.argv[1:])),
                   commit=git_commit(), machine=machine(),
                   load_per_core_before=load_per_core(), photo_size=PHOTO_SIZE)
    torch.set_num_threads(1)  # as in a DataLoader worker
    import cv2
    cv2.setNumThreads(0)      # as mmengine's env_cfg sets in workers (opencv_num_threads=0)
    fns = worker_pipelines(cfg, args.reference_dino)
    results['per_image'] = per_image_cpu_ms(fns, paths[:args.images], args.repeats)
    results['device_side'] = device_side_ms(cfg, fns['ours'], paths[:args.images],
                                            args.batch_size, args.device, args.repeats)
    torch.set_num_threads(os.cpu_count() or 1)
    results['loader'] = [loader_images_per_second(cfg, args.photos, n, args.batch_size,
                                                  args.batches) for n in args.workers]
    print_tables(results)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=1)
    print(f'\nwritten: {args.out}')
    return results


if __name__ == '__main__':
    main()
