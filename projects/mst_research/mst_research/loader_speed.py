"""What the 224-px pretraining input costs (projects/mst_research/tools/benchmark_loader.py): a data
worker's CPU time per image, ours against DINO's ``DataAugmentationDINO``, the batched
device-side part, and a DataLoader's images/s. docs/benchmarks.md explains the figures.
"""
import os
import os.path as osp
import time
from typing import Callable, Dict, List, Optional

import torch
from mmcv.transforms import Compose
from mmengine.config import Config
from mmengine.dataset import default_collate
from mmengine.registry import DefaultScope
from mmengine.runner import Runner
from mmpretrain.registry import MODELS
from PIL import Image

from mst_research import bench
from mst_research.data import write_photo_crops
from mst_research.dino_reference import import_reference_dino

CONFIG = 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'
PHOTO_SIZE = (500, 375)  # width, height: ImageNet's average photo
PIPELINE_NAMES = dict(ours='workers cut the crops (this code)',
                      ours_per_image='workers make the views whole (before)',
                      dino="DINO's DataAugmentationDINO")


def write_photos(folder: str, num_images: int) -> List[str]:
    """``num_images`` ImageNet-sized JPEGs in ``folder`` (kept when already there)."""
    width, height = PHOTO_SIZE
    write_photo_crops(folder, num_images=num_images, size=width, height=height, seed=0)
    return sorted(osp.join(folder, name) for name in os.listdir(folder)
                  if name.endswith('.jpg'))


def worker_pipelines(cfg: Config, dino_dir: Optional[str]) -> Dict[str, Callable]:
    """Each pipeline as a function of one image path: the config's (the workers cut the
    crops), the same views made whole in the worker, and with ``dino_dir`` DINO's."""
    def compose(pipeline: list) -> Callable:
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            transform = Compose(pipeline)
        return lambda path: transform(dict(img_path=path))

    pipeline = cfg.train_dataloader.dataset.pipeline
    whole = [dict(t, crops_only=False) if t['type'] == 'MultiCrop' else t for t in pipeline]
    fns = dict(ours=compose(pipeline), ours_per_image=compose(whole))
    if dino_dir:
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
    _, usage = bench.interleaved_times(over_images, repeats, warmup=1, device='cpu')
    cpu = {name: [1000 * (u['user'] + u['system']) / len(paths) for u in reps]
           for name, reps in usage.items()}
    ratios = {}
    for name in cpu:
        if name != 'ours':
            ratio, (low, high) = bench.ratio_over_repetitions(cpu[name], cpu['ours'])
            ratios[f'{name}_over_ours'] = dict(median=ratio, min=low, max=high)
    return dict(cpu_ms_per_image={name: bench.spread(ms) for name, ms in cpu.items()},
                ratios=ratios)


def device_side_ms(cfg: Config, fn: Callable, paths: List[str], batch_size: int,
                   device: str, repeats: int) -> dict:
    """Milliseconds per image of the model's data preprocessor in training (the batched
    augmentations and the normalisation) on ``device``, over a batch of worker outputs."""
    preprocessor = MODELS.build(cfg.model.data_preprocessor).to(device)
    batch = default_collate([fn(paths[i % len(paths)]) for i in range(batch_size)])
    times, _ = bench.interleaved_times(
        {'device_side': lambda: preprocessor(batch, training=True)}, repeats, warmup=1,
        device=device)
    return dict(device=device, batch_size=batch_size,
                **bench.spread([1000 * t / batch_size for t in times['device_side']]))


def loader_images_per_second(cfg: Config, folder: str, workers: int, batch_size: int,
                             batches: int) -> dict:
    """Images/s of the config's DataLoader over ``folder`` with ``workers`` workers, timed
    over ``batches`` batches after the first (which waits for the workers to start)."""
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
    for name, figure in per_image['cpu_ms_per_image'].items():
        ratio = per_image['ratios'].get('dino_over_ours') if name == 'ours' else None
        cell = bench.median_range(ratio, 2) if ratio else ''
        rows.append(f'| {PIPELINE_NAMES[name]} | {bench.median_range(figure, 2)} | {cell} |')
    rows.append(f'| device side ({device["device"]}, batch {device["batch_size"]}) '
                f'| {bench.median_range(device, 2)} | |')
    return rows


def print_tables(results: dict) -> None:
    """The docs' table of a run, every ratio and the DataLoader's images/s."""
    print('\n'.join(markdown_rows(results)))
    for name, ratio in results['per_image']['ratios'].items():
        print(f'{name}: {bench.median_range(ratio, 2)}')
    for row in results.get('loader', []):
        print(f'loader, {row["workers"]} workers, batch {row["batch_size"]}: '
              f'{row["images_per_second"]:.0f} images/s')
