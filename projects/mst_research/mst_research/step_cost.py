"""A pretraining config's training step on synthetic crops, and what its parts cost: MST
against DINO mode piece by piece, the float32 prototype layer against autocast, and the
memory a step holds (projects/mst_research/tools/benchmark.py and memory_per_image.py)."""
import copy
import inspect
import os.path as osp
from functools import partial
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS as REGISTRY

from mst_mm.datasets import MultiCrop
from mst_mm.engine.optimizers import AMP_OPTIM_WRAPPERS
from mst_mm.models import DINO_MODE
from mst_research import bench

# name: (pretraining config, default batch size per step on CPU)
MODELS = {
    'tiny': ('configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py', 64),
    'deit-s': ('configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 16),
    'swin-t': ('configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py', 16),
}
DEFAULT_BATCH_SIZE = 16  # for a config path without a --batch-size


def resolve_model(name: str) -> Tuple[str, int]:
    """(config file, default batch) of a --models entry: a key of ``MODELS`` or a config."""
    config, batch_size = MODELS.get(name, (name, DEFAULT_BATCH_SIZE))
    for path in (config, osp.join(bench.REPO, config)):
        if osp.isfile(path):
            return path, batch_size
    raise ValueError(f'--models takes built-in names ({", ".join(MODELS)}) or paths of '
                     f'config files; {name!r} is neither.')


def load_variants(config: str) -> Dict[str, Config]:
    """The config's model as MST, as the DINO baseline (no mask, no decoder) and as MST
    with the mask only (no decoder)."""
    mst = Config.fromfile(config)
    dino, mask_only = copy.deepcopy(mst), copy.deepcopy(mst)
    dino.merge_from_dict(dict(model=DINO_MODE))
    mask_only.merge_from_dict(dict(model=dict(decoder_head=None)))
    return dict(dino=dino, mask_only=mask_only, mst=mst)


def crop_settings(cfg: Config) -> dict:
    """global_size / local_size / num_local_crops of the config's MultiCrop."""
    defaults = {k: p.default for k, p in inspect.signature(MultiCrop).parameters.items()}
    for step in cfg.train_dataloader.dataset.pipeline:
        if step['type'] == 'MultiCrop':
            return {**defaults, **{k: v for k, v in step.items() if k != 'type'}}
    raise ValueError("The config's train pipeline has no MultiCrop.")


def synthetic_batch(cfg: Config, batch_size: int, device: str = 'cpu') -> dict:
    """Random 0-255 crops of the config's sizes, one (B, 3, S, S) tensor per view."""
    crops = crop_settings(cfg)
    gen = torch.Generator().manual_seed(0)
    sizes = [crops['global_size']] * 2 + [crops['local_size']] * crops['num_local_crops']
    views = [torch.randint(0, 256, (batch_size, 3, s, s), generator=gen).float().to(device)
             for s in sizes]
    return dict(inputs=views, data_samples=None)


def build_for_training(cfg: Config, device: str, amp: bool = False,
                       dtype: Optional[str] = None) -> tuple:
    """The config's model on ``device`` in training mode, and its optimiser wrapper (with
    ``amp``, the AMP wrapper, autocasting to ``dtype`` when given)."""
    MessageHub.get_current_instance().update_info('max_iters', 10_000)  # CosineEMA reads it
    torch.manual_seed(0)
    model = REGISTRY.build(cfg.model)
    model.init_weights()
    model.to(device).train()
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    if amp:
        optim_cfg.type = AMP_OPTIM_WRAPPERS[optim_cfg.get('type', 'OptimWrapper')]
        if dtype is not None:
            optim_cfg.dtype = dtype
    # The config's scope, as the runner sets it: mst_mm's constructors register there.
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmpretrain')):
        return model, build_optim_wrapper(model, optim_cfg)


def measure_steps(variants: Dict[str, Config], batch_size: int, repeats: int, warmup: int,
                  device: str) -> dict:
    """(a) MST's step against DINO mode's and MST's with the mask only, (b) the teacher's
    forward with and without its CLS attention, (c) the decoder's share of MST's step."""
    built = {name: build_for_training(cfg, device) for name, cfg in variants.items()}
    batch = synthetic_batch(variants['mst'], batch_size, device=device)
    times, usage = bench.interleaved_times(
        {name: partial(model.train_step, batch, optim_wrapper)
         for name, (model, optim_wrapper) in built.items()}, repeats, warmup, device)
    step_ratio, step_range = bench.ratio_over_repetitions(times['mst'], times['dino'])
    mask_ratio, mask_range = bench.ratio_over_repetitions(times['mask_only'], times['dino'])

    mst = built['mst'][0]
    global_crops = torch.cat(
        mst.data_preprocessor(batch, training=True)['inputs'][:mst.num_global_crops])
    teacher_backbone = mst.teacher.module[0]
    teacher_backbone.eval()  # mmpretrain's ViT.train() does not return self

    def teacher_forward(with_attn: bool) -> None:
        with torch.no_grad():
            teacher_backbone.forward_mst(global_crops, with_attn=with_attn, with_patches=False)

    attention = bench.interleaved_medians(
        dict(without=partial(teacher_forward, False), with_attn=partial(teacher_forward, True)),
        repeats * 3, warmup, device)
    result = dict(
        batch_size=batch_size, **bench.step_figures(times, usage),
        step_ratio=step_ratio, step_ratio_range_over_repetitions=step_range,
        mask_only_ratio=mask_ratio, mask_only_ratio_range_over_repetitions=mask_range,
        attention_forward_seconds=attention,
        attention_ratio=attention['with_attn'] / attention['without'])
    if mst.decoder_head is not None:
        with torch.no_grad():
            feat_map = mst.backbone.forward_mst(global_crops).feat_map

        def decoder_step() -> None:
            mst.decoder_head.loss(feat_map.detach().requires_grad_(), global_crops).backward()

        decoder = bench.interleaved_medians(dict(decoder=decoder_step), repeats, warmup, device)
        result.update(decoder_seconds=decoder['decoder'],
                      decoder_share=decoder['decoder'] / result['step_seconds']['mst'],
                      decoder_channels=list(mst.decoder_head.channels))
    return result


def measure_prototype_precision(config: str, batch_size: int, repeats: int, warmup: int,
                                device: str, dtype: str) -> dict:
    """The MST step under ``dtype`` autocast with the prototype layer in float32 against the
    same model's step with it left to autocast, interleaved; and the
    layer's share of the step's floating-point operations."""
    cfg = Config.fromfile(osp.join(bench.REPO, config))
    on_gpu = device.startswith('cuda')
    # On a GPU the AMP wrapper opens the autocast context, as in training; on the CPU the
    # float32 wrapper runs inside torch's CPU autocast.
    model, optim_wrapper = build_for_training(cfg, device, amp=on_gpu, dtype=dtype)
    batch = synthetic_batch(cfg, batch_size, device=device)
    necks = [model.neck, model.teacher.module[1]]

    def step(float32_prototypes: bool) -> None:
        for neck in necks:
            neck.__dict__.pop('_prototypes', None)
            if not float32_prototypes:
                neck._prototypes = partial(lambda n, x: n.last_layer(F.normalize(x, dim=-1)),
                                           neck)
        with torch.autocast('cpu', dtype=getattr(torch, dtype), enabled=not on_gpu):
            model.train_step(batch, optim_wrapper)

    try:
        times, _ = bench.interleaved_times({'float32': partial(step, True),
                                            'autocast': partial(step, False)},
                                           repeats, warmup, device)
        layer = model.neck.last_layer
        views = len(batch['inputs']) + model.num_global_crops  # the student's and the teacher's
        layer_flops = 2 * batch_size * layer.in_features * layer.out_features * (
            3 * len(batch['inputs']) + model.num_global_crops)  # student: forward + backward
        step_flops = bench.flops_of(partial(step, True))
    finally:
        for neck in necks:
            neck.__dict__.pop('_prototypes', None)
    ratio, ratio_range = bench.ratio_over_repetitions(times['float32'], times['autocast'])
    return dict(config=config, batch_size=batch_size, dtype=dtype, views=views,
                float32=bench.spread(times['float32']), autocast=bench.spread(times['autocast']),
                float32_over_autocast=ratio, float32_over_autocast_range=ratio_range,
                prototype_layer_flop_share=layer_flops / step_flops)


def step_memory_mib(config: str, batch_size: int, device: str) -> Dict[str, float]:
    """This process's peak memory over two training steps of ``config`` (MiB): on a GPU
    ``torch.cuda.max_memory_allocated``, on a CPU the peak resident memory."""
    cfg = Config.fromfile(config)
    model, optim_wrapper = build_for_training(cfg, device, amp=False)
    batch = synthetic_batch(cfg, batch_size, device=device)
    for _ in range(2):  # the second step also holds the optimiser's state
        model.train_step(batch, optim_wrapper)
    if device.startswith('cuda'):
        return dict(peak=torch.cuda.max_memory_allocated() / 2**20)
    return dict(peak=bench.peak_resident_mib())


def fit_memory_per_image(rows: List[dict]) -> Optional[Dict[str, float]]:
    """Least squares of the peak against the batch size: MiB per image and the fixed MiB."""
    if len(rows) < 2:
        return None
    xs = [r['batch_size'] for r in rows]
    ys = [r['peak'] for r in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
             / sum((x - mean_x)**2 for x in xs))
    return dict(mib_per_image=slope, fixed_mib=mean_y - slope * mean_x)


COST_HEADER = ('| model | batch | step DINO (s) | step MST (s) | MST / DINO (<= 1.10) '
               '| mask only / DINO | attn fwd ratio (<= 1.02) | decoder share '
               '| load per core before |')
PROTOTYPE_HEADER = ('| run | model | batch | autocast | step, layer float32 (s) | step, layer '
                    'autocast (s) | float32 / autocast | layer share of the FLOPs |')


def cost_row(results: dict, name: str) -> str:
    """One model's row of the cost table (markdown), as docs/benchmarks.md quotes it."""
    r = results['models'][name]
    share = f'{r["decoder_share"]:.1%}' if 'decoder_share' in r else 'n/a'
    ratios = [bench.range_cell(r[key], *r[key + '_range_over_repetitions'])
              for key in ('step_ratio', 'mask_only_ratio')]
    return (f'| {name} | {r["batch_size"]} | {bench.median_range(r["step_spread"]["dino"])} '
            f'| {bench.median_range(r["step_spread"]["mst"])} | {ratios[0]} | {ratios[1]} '
            f'| {r["attention_ratio"]:.3f} | {share} | {bench.load_cell(results)} |')


def prototype_row(results: dict, name: str) -> str:
    """One model's row of the prototype-precision table, without its run column."""
    r = results['models'][name]
    ratio = bench.range_cell(r['float32_over_autocast'], *r['float32_over_autocast_range'])
    return (f"| {name} | {r['batch_size']} | {r['dtype']} | {bench.median_range(r['float32'])} "
            f"| {bench.median_range(r['autocast'])} | {ratio} "
            f"| {100 * r['prototype_layer_flop_share']:.2f} % |")


def print_cost_table(results: dict) -> None:
    """The cost table of every model, and each one's CPU time and page faults per step."""
    print('\nsteps: median (min-max) seconds; ratios: of the medians (range of the ratios '
          'inside each repetition)\n\n' + COST_HEADER + '\n|' + ' --- |' * 9)
    for name in results['models']:
        print(cost_row(results, name))
    for name, r in results['models'].items():
        print(f'{name} {bench.usage_line(r["usage_per_step"])}')


def print_prototype_precision_table(results: dict) -> None:
    """The prototype-precision table, one row per model."""
    print(f"\nMST step, {results['device']}: prototype layer in float32 against autocast")
    print(PROTOTYPE_HEADER)
    print('| --- ' * PROTOTYPE_HEADER.count('|', 1) + '|')
    for name in results['models']:
        print(f"| {results['commit']} {prototype_row(results, name)}")
