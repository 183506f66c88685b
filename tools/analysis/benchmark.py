"""What MST costs over DINO, measured side by side in one run.

    python tools/analysis/benchmark.py [--models tiny deit-s swin-t] [--repeats 5]
        [--batch-size deit-s=16] [--device cpu|cuda] [--out work_dirs/benchmark.json]

For every model it measures, interleaved (the variants alternate inside every repetition,
so that drifts of a noisy machine hit both alike) and reports medians:

(a) ``step``: one full training step (data preprocessing, forward, backward, AdamW, EMA)
    of MST against the DINO baseline built from the same config with masking and decoder
    off, on the same crops and batch. Target: MST / DINO <= 1.10.
(b) ``attention``: the teacher's forward that also returns the last-layer CLS attention,
    against the same forward without it. Target <= 1.02.
(c) ``decoder``: forward + backward of the image decoder and its L1 loss, as a share of
    the MST step.
(d) ``pipeline``: multi-crop data pipeline throughput in images per second per worker
    (decode once per image, then every view): ``MultiCrop``'s fast transforms against
    mmpretrain's own ``RandomResizedCrop`` and ``ColorJitter`` composed the same way.
(e) ``memory``: peak memory of one training step of each variant, in a fresh process per
    variant: the CUDA allocator's peak over what was allocated before the step, or on the
    CPU the peak growth of the resident set during the second step (sampled every 2 ms; the
    first step allocates the optimiser state).

Speeds are never asserted in tests; ``tests/test_benchmark.py`` only runs this tool on the
tiny model and checks the JSON.
"""
import argparse
import copy
import inspect
import json
import logging
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

import torch
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

# name: (pretraining config, default batch size per step on CPU)
MODELS = {
    'tiny': ('configs/mst_vit-tiny_demo.py', 64),
    'deit-s': ('configs/mst_deit-s_300e.py', 16),
    'swin-t': ('configs/mst_swin-t_100e.py', 16),
}
DINO_OVERRIDES = dict(mask_cfg=dict(mode='none'), decoder_head=None)
TARGETS = dict(step=1.10, attention=1.02)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='MST vs DINO cost benchmark')
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    parser.add_argument('--repeats', type=int, default=5, help='timed repetitions (median)')
    parser.add_argument('--warmup', type=int, default=2, help='untimed steps per variant')
    parser.add_argument('--batch-size', nargs='+', default=[], metavar='MODEL=N',
                        help='batch size per model, e.g. deit-s=32')
    parser.add_argument('--pipeline-images', type=int, default=16,
                        help='images per timed pipeline pass')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--decoder-channels', type=int, nargs='+', metavar='C',
                        help='override the decoder widths of every model, e.g. 64 32 16 8')
    parser.add_argument('--skip-memory', action='store_true', help='skip (e)')
    parser.add_argument('--out', default='work_dirs/benchmark/benchmark.json')
    parser.add_argument('--memory-probe', help=argparse.SUPPRESS)  # internal: one child run
    return parser.parse_args(argv)


def load_variants(config: str, decoder_channels: Optional[List[int]] = None
                  ) -> Dict[str, Config]:
    """The config's model as MST, and the DINO baseline (no mask, no decoder) from it."""
    mst = Config.fromfile(osp.join(REPO, config))
    if decoder_channels:
        mst.model.decoder_head.channels = tuple(decoder_channels)
    dino = copy.deepcopy(mst)
    dino.merge_from_dict(dict(model=DINO_OVERRIDES))
    return dict(dino=dino, mst=mst)


def crop_settings(cfg: Config) -> dict:
    """global_size / local_size / num_local_crops of the config's MultiCrop."""
    from mst_mm.datasets import MultiCrop
    defaults = {k: p.default for k, p in inspect.signature(MultiCrop).parameters.items()}
    for step in cfg.train_dataloader.dataset.pipeline:
        if step['type'] == 'MultiCrop':
            return {**defaults, **{k: v for k, v in step.items() if k != 'type'}}
    raise ValueError('The config\'s train pipeline has no MultiCrop.')


def synthetic_batch(cfg: Config, batch_size: int, seed: int = 0) -> dict:
    crops = crop_settings(cfg)
    gen = torch.Generator().manual_seed(seed)
    sizes = [crops['global_size']] * 2 + [crops['local_size']] * crops['num_local_crops']
    views = [torch.randint(0, 256, (batch_size, 3, s, s), generator=gen).float() for s in sizes]
    return dict(inputs=views, data_samples=None)


def build_for_training(cfg: Config, device: str, seed: int = 0):
    from mmengine.logging import MessageHub
    from mmengine.optim import build_optim_wrapper
    from mmpretrain.registry import MODELS as REGISTRY
    MessageHub.get_current_instance().update_info('max_iters', 10_000)  # CosineEMA reads it
    torch.manual_seed(seed)
    model = REGISTRY.build(cfg.model)
    model.init_weights()
    model.to(device).train()
    return model, build_optim_wrapper(model, cfg.optim_wrapper)


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def interleaved_medians(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                        device: str) -> Dict[str, float]:
    """Median seconds of each function; the order flips every repetition."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(repeats):
        for name in (names if rep % 2 == 0 else names[::-1]):
            _sync(device)
            start = time.perf_counter()
            fns[name]()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure_steps(variants: Dict[str, Config], batch_size: int, repeats: int, warmup: int,
                  device: str) -> dict:
    """(a), (b) and (c) for one model."""
    built = {name: build_for_training(cfg, device) for name, cfg in variants.items()}
    batch = synthetic_batch(variants['mst'], batch_size)

    def step_fn(name):
        model, optim_wrapper = built[name]
        return lambda: model.train_step(batch, optim_wrapper)

    step = interleaved_medians({name: step_fn(name) for name in built}, repeats, warmup, device)

    mst = built['mst'][0]
    preprocessed = mst.data_preprocessor(batch, training=True)['inputs']
    global_crops = torch.cat(preprocessed[:mst.num_global_crops])
    teacher_backbone = mst.teacher.module[0]
    teacher_backbone.eval()  # mmpretrain's ViT.train() does not return self

    def teacher_forward(with_attn: bool):
        def run():
            with torch.no_grad():
                teacher_backbone.forward_mst(global_crops, with_attn=with_attn)
        return run

    attention = interleaved_medians(
        dict(without=teacher_forward(False), with_attn=teacher_forward(True)),
        repeats * 3, warmup, device)

    result = dict(
        batch_size=batch_size,
        step_seconds=step, step_ratio=step['mst'] / step['dino'],
        attention_forward_seconds=attention,
        attention_ratio=attention['with_attn'] / attention['without'])
    if mst.decoder_head is not None:
        with torch.no_grad():
            feat_map = mst.backbone.forward_mst(global_crops).feat_map

        def decoder_step():
            feats = feat_map.detach().requires_grad_()
            mst.decoder_head.loss(feats, global_crops).backward()

        decoder = interleaved_medians(dict(decoder=decoder_step), repeats, warmup, device)
        result.update(decoder_seconds=decoder['decoder'],
                      decoder_share=decoder['decoder'] / step['mst'],
                      decoder_channels=list(mst.decoder_head.channels))
    return result


def sample_images(folder: str, count: int, size: Optional[int]) -> List[str]:
    """Real photos bundled with scikit-image, as JPEG files (resized to `size` if given)."""
    from PIL import Image
    from skimage import data
    names = ('astronaut', 'chelsea', 'coffee', 'rocket', 'immunohistochemistry', 'cat')
    paths = []
    for i in range(count):
        image = Image.fromarray(getattr(data, names[i % len(names)])())
        if size:
            image = image.resize((size, size), Image.BICUBIC)
        paths.append(osp.join(folder, f'{i:03d}.jpg'))
        image.save(paths[-1], quality=90)
    return paths


def measure_pipeline(cfg: Config, images: int, repeats: int) -> dict:
    """(d): images per second of LoadImageFromFile + MultiCrop + PackInputs, one worker."""
    from mmcv.transforms import Compose
    from mmengine.registry import DefaultScope

    crops = crop_settings(cfg)
    # Full-size photos for 224-px crops; small images, like the demo's, for small crops.
    size = None if crops['global_size'] >= 96 else crops['global_size']
    with tempfile.TemporaryDirectory() as folder, \
            DefaultScope.overwrite_default_scope('mmpretrain'):
        paths = sample_images(folder, images, size)

        def pipeline(fast: bool):
            compose = Compose([dict(type='LoadImageFromFile'),
                               dict(crops, type='MultiCrop', fast_transforms=fast),
                               dict(type='PackInputs')])

            def run():
                for path in paths:
                    compose(dict(img_path=path))
            return run

        seconds = interleaved_medians(
            dict(mmpretrain_default=pipeline(False), mst_mm=pipeline(True)), repeats, 1, 'cpu')
    per_second = {name: images / s for name, s in seconds.items()}
    return dict(images_per_second=per_second,
                speedup=per_second['mst_mm'] / per_second['mmpretrain_default'],
                views_per_image=2 + crops['num_local_crops'],
                source_image_size=size or 'bundled photos (300-640 px)')


def peak_step_memory(config: str, variant: str, batch_size: int, device: str,
                     decoder_channels: Optional[List[int]] = None) -> float:
    """(e) in MiB, measured in a fresh process so that earlier runs leave no peak behind."""
    probe = json.dumps(dict(config=config, variant=variant, batch_size=batch_size,
                            device=device, decoder_channels=decoder_channels))
    out = subprocess.run([sys.executable, osp.abspath(__file__), '--memory-probe', probe],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])['peak_mib']


def _resident_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _memory_probe(spec: dict) -> None:
    import mst_mm  # noqa: F401
    cfg = load_variants(spec['config'], spec['decoder_channels'])[spec['variant']]
    model, optim_wrapper = build_for_training(cfg, spec['device'])
    batch = synthetic_batch(cfg, spec['batch_size'])
    if spec['device'].startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model.train_step(batch, optim_wrapper)
        peak = torch.cuda.max_memory_allocated() - base
    else:
        model.train_step(batch, optim_wrapper)  # optimiser state exists from here on
        base = _resident_bytes()
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _resident_bytes())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        model.train_step(batch, optim_wrapper)
        done.set()
        sampler.join()
        peak = peak[0] - base
    print(json.dumps(dict(peak_mib=peak / 2**20)))


def machine() -> dict:
    info = dict(platform=platform.platform(), python=platform.python_version(),
                torch=torch.__version__, cpus=os.cpu_count(),
                torch_threads=torch.get_num_threads())
    if torch.cuda.is_available():
        info['gpu'] = torch.cuda.get_device_name()
    return info


def print_table(results: dict) -> None:
    print('\n| model | batch | step DINO (s) | step MST (s) | MST/DINO (<= 1.10) '
          '| attn fwd ratio (<= 1.02) | decoder share | pipeline img/s default -> fast '
          '| peak MiB DINO / MST |')
    print('|' + ' --- |' * 9)
    for name, r in results['models'].items():
        if 'skipped' in r:
            print(f'| {name} | skipped: {r["skipped"]} |' + ' |' * 7)
            continue
        pipe = r['pipeline']['images_per_second']
        memory = r.get('peak_memory_mib', {})
        mem = ' / '.join(f'{memory[v]:.0f}' for v in ('dino', 'mst')) if memory else 'n/a'
        share = f'{r["decoder_share"]:.1%}' if 'decoder_share' in r else 'n/a'
        print(f'| {name} | {r["batch_size"]} | {r["step_seconds"]["dino"]:.3f} '
              f'| {r["step_seconds"]["mst"]:.3f} | {r["step_ratio"]:.3f} '
              f'| {r["attention_ratio"]:.3f} | {share} '
              f'| {pipe["mmpretrain_default"]:.1f} -> {pipe["mst_mm"]:.1f} '
              f'(x{r["pipeline"]["speedup"]:.2f}) | {mem} |')


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.memory_probe:
        _memory_probe(json.loads(args.memory_probe))
        return {}
    from mmengine.logging import MMLogger

    import mst_mm  # noqa: F401
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # no per-parameter lines
    batch_sizes = {name: batch for name, (_, batch) in MODELS.items()}
    for item in args.batch_size:
        name, _, value = item.partition('=')
        if name not in MODELS or not value.isdigit():
            raise ValueError(f'--batch-size takes MODEL=N with MODEL in {list(MODELS)}, '
                             f'got {item!r}.')
        batch_sizes[name] = int(value)

    results = dict(command='python tools/analysis/benchmark.py ' + ' '.join(
        argv if argv is not None else sys.argv[1:]), machine=machine(), device=args.device,
        repeats=args.repeats, models={})
    for name in args.models:
        config, _ = MODELS[name]
        if not osp.isfile(osp.join(REPO, config)):
            results['models'][name] = dict(skipped=f'{config} does not exist yet')
            continue
        print(f'[{name}] timing training steps ...', flush=True)
        variants = load_variants(config, args.decoder_channels)
        result = measure_steps(variants, batch_sizes[name], args.repeats, args.warmup,
                               args.device)
        print(f'[{name}] timing the data pipeline ...', flush=True)
        result['pipeline'] = measure_pipeline(variants['mst'], args.pipeline_images,
                                              args.repeats)
        if not args.skip_memory:
            print(f'[{name}] peak memory ...', flush=True)
            result['peak_memory_mib'] = {
                variant: peak_step_memory(config, variant, batch_sizes[name], args.device,
                                          args.decoder_channels)
                for variant in variants}
        results['models'][name] = result

    print_table(results)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=2)
    print(f'\nwritten to {args.out}')
    return results


if __name__ == '__main__':
    main()
