"""What MST costs over DINO, and how our training step compares with the original DINO code.

Without ``--reference-dino``, per model: (a) the MST step against the DINO baseline of the
same config and MST with the mask only, (b) the teacher's forward with and without its CLS
attention, (c) the decoder's share of the MST step.
With ``--prototype-precision DTYPE``, per model: the MST step under autocast in DTYPE with the
DINO neck's prototype layer in float32 (mst_mm's) against the same step with that layer left
to autocast, and the layer's share of the step's operations.
With ``--reference-dino DIR`` (a facebookresearch/dino clone, imported at run time): DINO's
``main_dino.py`` step against our DINO mode and MST on the same crops, with FLOP counts, and
on a GPU each step's peak memory; ``--dtypes`` times our steps in several autocast dtypes
side by side (DINO's own step keeps its float16 autocast).

Timings are interleaved (the variants take turns in every repetition, in a rotating order),
so a drift of the machine's speed cancels in their ratios. A ratio is that of the median
times, printed with the range of the ratios inside each repetition and the 1-minute load
average per core before timing. docs/benchmarks.md explains every figure.
"""
import argparse
import copy
import importlib
import inspect
import json
import logging
import math
import os
import os.path as osp
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)
from mst_mm.compat import grad_scaler, math_attention  # noqa: E402
from mst_mm.models import DINO_MODE  # noqa: E402

# name: (pretraining config, default batch size per step on CPU)
MODELS = {
    'tiny': ('configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py', 64),
    'deit-s': ('configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 16),
    'swin-t': ('configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py', 16),
}
DEFAULT_BATCH_SIZE = 16  # for a config path without a --batch-size
# The modules of a facebookresearch/dino clone that the reference step uses.
REFERENCE_MODULES = ('main_dino', 'utils', 'vision_transformer')
# mmpretrain ViT arch -> DINO's constructor (mmpretrain's 'small' is 768 wide and 8 deep,
# not DINO's ViT-S: only the DeiT names and base match)
REFERENCE_ARCHS = {'deit-t': 'vit_tiny', 'deit-tiny': 'vit_tiny', 'deit-s': 'vit_small',
                   'deit-small': 'vit_small', 'deit-b': 'vit_base', 'deit-base': 'vit_base',
                   'b': 'vit_base', 'base': 'vit_base'}
# ratio in the JSON -> (numerator, denominator); speed is reference seconds / ours
REFERENCE_RATIOS = {'dino_mode_speed_vs_reference': ('reference_dino', 'dino_mode'),
                    'mst_speed_vs_reference': ('reference_dino', 'mst'),
                    'mst_over_dino_mode': ('mst', 'dino_mode')}


def build_parser() -> argparse.ArgumentParser:
    """The command line of this tool; every option has a help text."""
    parser = argparse.ArgumentParser(
        description='MST vs DINO cost benchmark, and our step against the original DINO code',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--models', nargs='+', default=None, metavar='MODEL_OR_CONFIG',
                        help=f'built-in models ({", ".join(MODELS)}) or paths to pretraining '
                        'configs; default: every built-in, or deit-s with --reference-dino')
    parser.add_argument('--repeats', type=int, default=5,
                        help='timed repetitions of every variant (the median is reported)')
    parser.add_argument('--warmup', type=int, default=2, help='untimed steps per variant')
    parser.add_argument('--batch-size', type=int, default=None,
                        help='images per step of every model; default: '
                        + ', '.join(f'{k} {v}' for k, (_, v) in MODELS.items())
                        + f', a config path {DEFAULT_BATCH_SIZE}')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='where the steps run: cpu or cuda')
    parser.add_argument('--threads', type=int, default=None,
                        help="torch CPU threads (torch.set_num_threads); default: torch's own")
    parser.add_argument('--reference-dino', metavar='DIR',
                        help='a clone of facebookresearch/dino: time its main_dino.py step '
                        'against our DINO mode and MST instead of (a)-(c)')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help="mixed precision on both sides of --reference-dino (DINO's "
                        'autocast + GradScaler, our AMP optimiser wrapper); default: on '
                        'with CUDA, off on the CPU')
    parser.add_argument('--dtypes', nargs='+', choices=('float16', 'bfloat16'), default=None,
                        help='with --reference-dino and AMP: the autocast dtype of our steps; '
                        'several are timed side by side as steps named dino_mode_DTYPE and '
                        "mst_DTYPE (DINO's step keeps its float16); default: our AMP "
                        "optimiser wrapper's own (float16 on CUDA), steps dino_mode and mst")
    parser.add_argument('--prototype-precision', choices=('float16', 'bfloat16'), default=None,
                        help='instead of (a)-(c): the MST step under autocast in this dtype '
                        "with the DINO neck's prototype layer in float32 against the same "
                        'step with the layer left to autocast (on the CPU, bfloat16 only)')
    parser.add_argument('--peak-tflops', type=float, default=None,
                        help="with --reference-dino: the device's dense peak in TFLOP/s for "
                        'the precision used (e.g. 989 for an H100 in bf16), to report the '
                        'model FLOP utilisation of each step')
    parser.add_argument('--out', default='work_dirs/benchmark/benchmark.json',
                        help='the JSON file that receives every figure')
    return parser


def resolve_model(name: str) -> Tuple[str, int]:
    """(config file, default batch) of a --models entry: a key of ``MODELS`` or a config."""
    config, batch_size = MODELS.get(name, (name, DEFAULT_BATCH_SIZE))
    for path in (config, osp.join(REPO, config)):
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
    from mst_mm.datasets import MultiCrop
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
                       dtype: Optional[str] = None):
    """The config's model on ``device`` in training mode, and its optimiser wrapper (with
    ``amp``, the AMP wrapper, autocasting to ``dtype`` when given)."""
    from mmengine.logging import MessageHub
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS as REGISTRY

    from mst_mm.engine.optimizers import AMP_OPTIM_WRAPPERS
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


def interleaved_times(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                      device: str) -> Tuple[Dict[str, List[float]], Dict[str, List[dict]]]:
    """Seconds of every repetition of each function, the order rotating every repetition,
    and what this process spent in each (``getrusage``: user and system CPU seconds, pages
    first touched), which other processes on a shared machine disturb far less."""
    for fn in list(fns.values()) * warmup:
        fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    usage: Dict[str, List[dict]] = {name: [] for name in fns}
    names = list(fns)
    sync = torch.cuda.synchronize if device.startswith('cuda') else lambda: None
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            sync()
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            fns[name]()
            sync()
            times[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_SELF)
            usage[name].append(dict(user=after.ru_utime - before.ru_utime,
                                    system=after.ru_stime - before.ru_stime,
                                    minor_faults=after.ru_minflt - before.ru_minflt))
    return times, usage


def interleaved_medians(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                        device: str) -> Dict[str, float]:
    """Median seconds of each function, timed by :func:`interleaved_times`."""
    times, _ = interleaved_times(fns, repeats, warmup, device)
    return {name: statistics.median(t) for name, t in times.items()}


def usage_medians(usage: Dict[str, List[dict]]) -> Dict[str, Dict[str, float]]:
    """Per step, the medians over the repetitions of :func:`interleaved_times`'s usage."""
    return {name: {key: statistics.median(u[key] for u in reps) for key in reps[0]}
            for name, reps in usage.items()}


def ratio_over_repetitions(numerator: List[float], denominator: List[float]
                           ) -> Tuple[float, List[float]]:
    """median(numerator) / median(denominator), and [min, max] of the ratios taken inside
    each repetition: the spread that the machine's drift leaves in the ratio."""
    per_rep = [n / d for n, d in zip(numerator, denominator)]
    return (statistics.median(numerator) / statistics.median(denominator),
            [min(per_rep), max(per_rep)])


def spread(times: List[float]) -> dict:
    median = statistics.median(times)
    return dict(median=median, min=min(times), max=max(times),
                spread=(max(times) - min(times)) / median, all=times)


def measure_steps(variants: Dict[str, Config], batch_size: int, repeats: int, warmup: int,
                  device: str) -> dict:
    """(a), (b) and (c) for one model."""
    built = {name: build_for_training(cfg, device) for name, cfg in variants.items()}
    batch = synthetic_batch(variants['mst'], batch_size, device=device)
    times, usage = interleaved_times(
        {name: partial(model.train_step, batch, optim_wrapper)
         for name, (model, optim_wrapper) in built.items()}, repeats, warmup, device)
    step_ratio, step_range = ratio_over_repetitions(times['mst'], times['dino'])
    mask_ratio, mask_range = ratio_over_repetitions(times['mask_only'], times['dino'])

    mst = built['mst'][0]
    global_crops = torch.cat(
        mst.data_preprocessor(batch, training=True)['inputs'][:mst.num_global_crops])
    teacher_backbone = mst.teacher.module[0]
    teacher_backbone.eval()  # mmpretrain's ViT.train() does not return self

    def teacher_forward(with_attn: bool) -> None:
        with torch.no_grad():
            teacher_backbone.forward_mst(global_crops, with_attn=with_attn, with_patches=False)

    attention = interleaved_medians(
        dict(without=partial(teacher_forward, False), with_attn=partial(teacher_forward, True)),
        repeats * 3, warmup, device)
    result = dict(
        batch_size=batch_size,
        step_seconds={name: statistics.median(t) for name, t in times.items()},
        step_ratio=step_ratio, step_ratio_range_over_repetitions=step_range,
        step_spread={name: spread(t) for name, t in times.items()},
        mask_only_ratio=mask_ratio, mask_only_ratio_range_over_repetitions=mask_range,
        usage_per_step=usage_medians(usage),
        attention_forward_seconds=attention,
        attention_ratio=attention['with_attn'] / attention['without'])
    if mst.decoder_head is not None:
        with torch.no_grad():
            feat_map = mst.backbone.forward_mst(global_crops).feat_map

        def decoder_step() -> None:
            mst.decoder_head.loss(feat_map.detach().requires_grad_(), global_crops).backward()

        decoder = interleaved_medians(dict(decoder=decoder_step), repeats, warmup, device)
        result.update(decoder_seconds=decoder['decoder'],
                      decoder_share=decoder['decoder'] / result['step_seconds']['mst'],
                      decoder_channels=list(mst.decoder_head.channels))
    return result


# ---------------------------------------------------------------- the reference DINO step

def measure_prototype_precision(config: str, batch_size: int, repeats: int, warmup: int,
                                device: str, dtype: str) -> dict:
    """The MST step under ``dtype`` autocast with the prototype layer in float32 against the
    same model's step with it left to autocast (the earlier code), interleaved; and the
    layer's share of the step's floating-point operations."""
    import torch.nn.functional as F
    cfg = Config.fromfile(osp.join(REPO, config))
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
        times, _ = interleaved_times({'float32': partial(step, True),
                                      'autocast': partial(step, False)},
                                     repeats, warmup, device)
        layer = model.neck.last_layer
        views = len(batch['inputs']) + model.num_global_crops  # the student's and the teacher's
        layer_flops = 2 * batch_size * layer.in_features * layer.out_features * (
            3 * len(batch['inputs']) + model.num_global_crops)  # student: forward + backward
        step_flops = flops_of(partial(step, True))
    finally:
        for neck in necks:
            neck.__dict__.pop('_prototypes', None)
    ratio, ratio_range = ratio_over_repetitions(times['float32'], times['autocast'])
    return dict(config=config, batch_size=batch_size, dtype=dtype, views=views,
                float32=spread(times['float32']), autocast=spread(times['autocast']),
                float32_over_autocast=ratio, float32_over_autocast_range=ratio_range,
                prototype_layer_flop_share=layer_flops / step_flops)


PROTOTYPE_HEADER = ('| run | model | batch | autocast | step, layer float32 (s) | step, layer '
                    'autocast (s) | float32 / autocast | layer share of the FLOPs |')


def prototype_row(results: dict, name: str) -> str:
    """One model's row of the prototype-precision table, without its run column."""
    r = results['models'][name]
    low, high = r['float32_over_autocast_range']
    return (f"| {name} | {r['batch_size']} | {r['dtype']} | {median_range(r['float32'])} | "
            f"{median_range(r['autocast'])} | {r['float32_over_autocast']:.3f} "
            f"({low:.3f}-{high:.3f}) | {100 * r['prototype_layer_flop_share']:.2f} % |")


def print_prototype_precision_table(results: dict) -> None:
    print(f"\nMST step, {results['device']}: prototype layer in float32 against autocast")
    print(PROTOTYPE_HEADER)
    print('| --- ' * PROTOTYPE_HEADER.count('|', 1) + '|')
    for name in results['models']:
        print(f"| {results['commit']} {prototype_row(results, name)}")


def flops_of(fn: Callable[[], None]) -> int:
    """Floating-point operations of one call of ``fn`` (forward and backward), counted, with
    attention on the math backend: torch's counter counts the CPU's fused kernel as zero."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with math_attention(), counter:
        fn()
    return counter.get_total_flops()


def import_reference_dino(folder: str) -> dict:
    """A DINO clone's modules by name. They import each other by top-level name, so the
    folder goes first on ``sys.path`` for the import; then ``sys.path`` is restored."""
    folder = osp.abspath(folder)
    missing = [f'{name}.py' for name in REFERENCE_MODULES
               if not osp.isfile(osp.join(folder, f'{name}.py'))]
    if missing:
        raise FileNotFoundError(
            f'--reference-dino {folder} is not a clone of facebookresearch/dino: it lacks '
            f'{", ".join(missing)}. Clone it with `git clone '
            "https://github.com/facebookresearch/dino` and pass the clone's root folder.")
    saved = {name: sys.modules.pop(name) for name in REFERENCE_MODULES if name in sys.modules}
    sys.path.insert(0, folder)
    try:
        return {name: importlib.import_module(name) for name in REFERENCE_MODULES}
    finally:
        sys.path.remove(folder)
        for name in REFERENCE_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def reference_vit(vits, backbone: dict, drop_path_rate: float) -> torch.nn.Module:
    """DINO's ViT for our ``MaskViT`` config: its named constructor for a named arch, else
    its ``VisionTransformer`` with the arch's widths (qkv bias, LayerNorm eps 1e-6)."""
    arch = backbone.get('arch', 'base')
    patch_size = backbone.get('patch_size', 16)
    if isinstance(arch, str):
        if arch not in REFERENCE_ARCHS:
            raise ValueError(f'--reference-dino: DINO has no ViT for arch {arch!r}; it has '
                             f'{sorted(set(REFERENCE_ARCHS.values()))} '
                             f'(ours: {sorted(REFERENCE_ARCHS)}).')
        return vits.__dict__[REFERENCE_ARCHS[arch]](patch_size=patch_size,
                                                    drop_path_rate=drop_path_rate)
    embed_dim = arch['embed_dims']
    return vits.VisionTransformer(
        img_size=[backbone.get('img_size', 224)], patch_size=patch_size, embed_dim=embed_dim,
        depth=arch['num_layers'], num_heads=arch['num_heads'],
        mlp_ratio=arch.get('feedforward_channels', 4 * embed_dim) / embed_dim, qkv_bias=True,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), drop_path_rate=drop_path_rate)


class ReferenceDINOStep:
    """``main_dino.py``'s training step from DINO's own pieces, with our config's settings;
    only the order of ``train_one_epoch``'s loop body is restated. No DDP (ours alike)."""

    def __init__(self, dino_dir: str, cfg: Config, device: str, amp: bool = False) -> None:
        import torch.distributed as dist
        main_dino, utils, vits = (import_reference_dino(dino_dir)[name]
                                  for name in REFERENCE_MODULES)
        backbone, neck, head = cfg.model.backbone, cfg.model.neck, cfg.model.head
        if backbone.get('type') != 'MaskViT':
            raise ValueError(
                "--reference-dino compares ViTs only (DINO has no Swin); this config's "
                f'backbone is {backbone.get("type")}. Use a ViT config such as deit-s.')
        if not dist.is_initialized():  # DINO's loss all-reduces its centre
            store = osp.join(tempfile.mkdtemp(prefix='dino_reference_pg_'), 'store')
            dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo',
                                    init_method=f'file://{store}', rank=0, world_size=1)
        head_kwargs = dict(use_bn=neck.get('with_bn', True), nlayers=neck.get('num_layers', 3),
                           hidden_dim=neck.get('hidden_channels', 2048),
                           bottleneck_dim=neck.get('bottleneck_channels', 256))
        out_dim = neck.get('out_channels', 65536)
        torch.manual_seed(0)
        student = reference_vit(vits, backbone, backbone.get('drop_path_rate', 0.))
        teacher = reference_vit(vits, backbone, 0.)
        self.student = utils.MultiCropWrapper(student, vits.DINOHead(
            student.embed_dim, out_dim, norm_last_layer=neck.get('norm_last_layer', True),
            **head_kwargs)).to(device)
        self.teacher = utils.MultiCropWrapper(teacher, vits.DINOHead(
            student.embed_dim, out_dim, **head_kwargs)).to(device)
        self.teacher.load_state_dict(self.student.state_dict())
        self.teacher.requires_grad_(False)
        teacher_temp = head.get('teacher_temp', 0.04)
        # A one-epoch schedule at the config's starting temperature, as at iteration 0.
        self.dino_loss = main_dino.DINOLoss(
            out_dim, 2 + crop_settings(cfg)['num_local_crops'], teacher_temp, teacher_temp, 0, 1,
            student_temp=head.get('student_temp', 0.1),
            center_momentum=head.get('center_momentum', 0.9)).to(device)
        self.optimizer = torch.optim.AdamW(utils.get_params_groups(self.student))
        optimizer_cfg = cfg.optim_wrapper.optimizer
        self.lr, self.weight_decay = optimizer_cfg.lr, optimizer_cfg.get('weight_decay', 0.04)
        self.clip_grad = (cfg.optim_wrapper.get('clip_grad') or {}).get('max_norm', 0.)
        self.momentum = 1 - cfg.model.get('base_momentum', 0.004)  # DINO's convention
        self.utils, self.device, self.amp = utils, device, amp
        self.scaler = grad_scaler('cuda') if amp else None

    def state(self) -> Tuple[List[torch.nn.Module], List[torch.optim.Optimizer]]:
        """What this step keeps between calls: its modules and its optimiser."""
        return [self.student, self.teacher, self.dino_loss], [self.optimizer]

    def __call__(self, images: List[torch.Tensor]) -> float:
        """One step on normalised crops (global crops first); returns the loss."""
        for i, group in enumerate(self.optimizer.param_groups):
            group['lr'] = self.lr
            if i == 0:  # DINO regularises the first group only
                group['weight_decay'] = self.weight_decay
        with torch.autocast(device_type='cuda' if self.device.startswith('cuda') else 'cpu',
                            enabled=self.amp):
            teacher_output = self.teacher(images[:2])
            loss = self.dino_loss(self.student(images), teacher_output, 0)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f'The reference DINO step gave a loss of {loss.item()}.')
        self.optimizer.zero_grad()
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        if self.clip_grad:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            self.utils.clip_gradients(self.student, self.clip_grad)
        # epoch 0, freeze_last_layer 0: the last layer is trained, as ours is
        self.utils.cancel_gradients_last_layer(0, self.student, 0)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        with torch.no_grad():  # DINO's EMA loop
            m = self.momentum
            for param_q, param_k in zip(self.student.parameters(), self.teacher.parameters()):
                param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
        return loss.item()  # DINO's metric logger reads it


def our_step_names(dtypes: Optional[List[str]]) -> Dict[str, Tuple[str, Optional[str]]]:
    """Our steps of a ``--reference-dino`` run: name -> (variant of :func:`load_variants`,
    autocast dtype). Without ``dtypes``, ``dino_mode`` and ``mst`` in the wrapper's own."""
    if not dtypes:
        return dict(dino_mode=('dino', None), mst=('mst', None))
    return {f'{name}_{dtype}': (variant, dtype) for dtype in dtypes
            for name, variant in (('dino_mode', 'dino'), ('mst', 'mst'))}


def reference_ratios(dtypes: Optional[List[str]]) -> Dict[str, Tuple[str, str]]:
    """``REFERENCE_RATIOS``, once per dtype of ``--dtypes`` (keys and steps suffixed)."""
    suffixes = [f'_{dtype}' for dtype in dtypes] if dtypes else ['']
    return {key + suffix: tuple(step if step == 'reference_dino' else step + suffix
                                for step in steps)
            for suffix in suffixes for key, steps in REFERENCE_RATIOS.items()}


def state_bytes(modules: List[torch.nn.Module], optimizers: List[torch.optim.Optimizer],
                tensors: List[torch.Tensor] = ()) -> int:
    """Bytes of the storages that a step keeps between calls (parameters, buffers,
    gradients, optimiser state) and of its inputs, each storage counted once."""
    found = list(tensors)
    for module in modules:
        found += list(module.parameters()) + list(module.buffers())
        found += [p.grad for p in module.parameters() if p.grad is not None]
    for optimizer in optimizers:
        found += [v for state in optimizer.state.values() for v in state.values()
                  if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in found}
    return sum(storages.values())


def peak_memory_gib(step: Callable[[], None], resident: int, device: str) -> Optional[float]:
    """GiB that one call of ``step`` needs on its own on a CUDA device: what it keeps
    (``resident`` bytes) plus what the call allocated above what was allocated before it
    (``torch.cuda.max_memory_allocated``), so that the other steps' models, resident at the
    same time, do not count. None on the CPU."""
    if not device.startswith('cuda'):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (resident + torch.cuda.max_memory_allocated() - before) / 2**30


def compare_with_reference(config: str, dino_dir: str, batch_size: int, repeats: int,
                           warmup: int, device: str, amp: bool,
                           dtypes: Optional[List[str]] = None) -> dict:
    """The reference step and ours (per dtype), interleaved on the same crops, with their
    ratios, spreads, FLOP counts and (on a GPU) peak memory."""
    from mmpretrain.registry import MODELS as REGISTRY
    variants = load_variants(config)
    cfg = variants['mst']
    names = our_step_names(dtypes)
    ours = {name: build_for_training(variants[variant], device, amp=amp, dtype=dtype)
            for name, (variant, dtype) in names.items()}
    reference = ReferenceDINOStep(dino_dir, cfg, device, amp)
    batch = synthetic_batch(cfg, batch_size, device=device)
    # DINO's data loader normalises in its workers; our step normalises in its preprocessor.
    with torch.no_grad():
        normalised = REGISTRY.build(cfg.model.data_preprocessor).to(device)(
            batch, training=True)['inputs']
    steps = dict(reference_dino=partial(reference, normalised),
                 **{name: partial(model.train_step, batch, optim_wrapper)
                    for name, (model, optim_wrapper) in ours.items()})
    times, usage = interleaved_times(steps, repeats, warmup, device)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    # A dtype changes no FLOP count: each variant is counted once, in the first dtype.
    flops = dict(reference_dino=flops_of(steps['reference_dino']))
    for name, (variant, _) in names.items():
        counted = next(n for n, (v, _) in names.items() if v == variant)
        flops[name] = flops[counted] if counted in flops else flops_of(steps[name])
    states = dict(reference_dino=reference.state(),
                  **{name: ([model], [optim_wrapper.optimizer])
                     for name, (model, optim_wrapper) in ours.items()})
    inputs = dict(reference_dino=list(normalised),
                  **{name: list(batch['inputs']) for name in ours})
    memory = {name: peak_memory_gib(step, state_bytes(*states[name], inputs[name]), device)
              for name, step in steps.items()}
    ratios = {key: ratio_over_repetitions(times[num], times[den])
              for key, (num, den) in reference_ratios(dtypes).items()}
    crops = crop_settings(cfg)
    return dict(
        batch_size=batch_size, amp=amp, reference_dino=osp.abspath(dino_dir),
        dtypes={name: dtype for name, (_, dtype) in names.items()} if dtypes else None,
        crops=f'2 x {crops["global_size"]} + {crops["num_local_crops"]} x '
              f'{crops["local_size"]} px',
        out_channels=cfg.model.neck.get('out_channels'),
        step_seconds=seconds,
        images_per_second={name: batch_size / s for name, s in seconds.items()},
        gflops_per_image={name: f / batch_size / 1e9 for name, f in flops.items()},
        peak_memory_gib=memory,
        step_spread={name: spread(t) for name, t in times.items()},
        **{key: ratio for key, (ratio, _) in ratios.items()},
        ratio_range_over_repetitions={key.replace('_vs_reference', ''): ratio_range
                                      for key, (_, ratio_range) in ratios.items()},
        usage_per_step=usage_medians(usage))


# ------------------------------------------------------------------- machine and output

def load_per_core() -> Optional[float]:
    """The 1-minute load average per core, or None where the system does not tell."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return None


def machine() -> dict:
    """Where the figures come from: another CPU gives other ratios."""
    cpu = platform.processor()
    if osp.isfile('/proc/cpuinfo'):  # the CPU's name as the kernel gives it
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f
                        if line.startswith('model name')), cpu)
    info = dict(platform=platform.platform(), cpu=cpu, python=platform.python_version(),
                torch=torch.__version__, cpus=os.cpu_count(),
                torch_threads=torch.get_num_threads())
    if torch.cuda.is_available():
        info['gpu'] = torch.cuda.get_device_name()
    return info


def git_commit() -> Optional[str]:
    """The repository's commit, with ``+dirty`` when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(['git', '-C', REPO, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        dirty = git('status', '--porcelain', '--untracked-files=no')
        return git('rev-parse', '--short', 'HEAD') + ('+dirty' if dirty else '')
    except (OSError, subprocess.CalledProcessError):
        return None


def load_cell(results: dict) -> str:
    """The load per core before timing; runs up to commit 7082b6f kept it in a verdict."""
    load = results.get('load_per_core_before',
                       results.get('verdict', {}).get('load_per_core_before'))
    return 'n/a' if load is None else f'{load:.2f}'


def median_range(spread: dict) -> str:
    """'median (min-max)' of a :func:`spread` result, in seconds."""
    return f'{spread["median"]:.3f} ({spread["min"]:.3f}-{spread["max"]:.3f})'


COST_HEADER = ('| model | batch | step DINO (s) | step MST (s) | MST / DINO (<= 1.10) '
               '| mask only / DINO | attn fwd ratio (<= 1.02) | decoder share '
               '| load per core before |')


def cost_row(results: dict, name: str) -> str:
    """One model's row of the cost table (markdown), as docs/benchmarks.md quotes it."""
    r = results['models'][name]
    share = f'{r["decoder_share"]:.1%}' if 'decoder_share' in r else 'n/a'
    ratios = [f'{r[key]:.3f} ({r[key + "_range_over_repetitions"][0]:.3f}-'
              f'{r[key + "_range_over_repetitions"][1]:.3f})'
              for key in ('step_ratio', 'mask_only_ratio')]
    return (f'| {name} | {r["batch_size"]} | {median_range(r["step_spread"]["dino"])} '
            f'| {median_range(r["step_spread"]["mst"])} | {ratios[0]} | {ratios[1]} '
            f'| {r["attention_ratio"]:.3f} | {share} | {load_cell(results)} |')


def reference_summary_row(results: dict, name: str) -> str:
    """One ``--reference-dino`` run as a row of docs/benchmarks.md's results table: torch
    threads | DINO mode speed | MST speed | MST / DINO mode | load per core before."""
    r = results['models'][name]
    cells = [str(results['machine']['torch_threads'])]
    for key in REFERENCE_RATIOS:
        low, high = r['ratio_range_over_repetitions'][key.replace('_vs_reference', '')]
        cells.append(f'{r[key]:.3f} ({low:.3f}-{high:.3f})')
    return '| ' + ' | '.join(cells + [load_cell(results)]) + ' |'


def usage_line(used: Dict[str, Dict[str, float]]) -> str:
    return 'per step, median: ' + ', '.join(
        f'{step} user {u["user"]:.3f} s, system {u["system"]:.3f} s, '
        f'{u["minor_faults"]:.0f} page faults' for step, u in used.items())


def print_cost_table(results: dict) -> None:
    print('\nsteps: median (min-max) seconds; ratios: of the medians (range of the ratios '
          'inside each repetition)\n\n' + COST_HEADER + '\n|' + ' --- |' * 9)
    for name in results['models']:
        print(cost_row(results, name))
    for name, r in results['models'].items():
        print(f'{name} {usage_line(r["usage_per_step"])}')


def print_reference_table(results: dict) -> None:
    peak = results.get('peak_tflops')
    for name, r in results['models'].items():
        print(f'\n[{name}] batch {r["batch_size"]}, {r["crops"]}, K = {r["out_channels"]}, '
              f'AMP {"on" if r["amp"] else "off"}, median of {results["repeats"]}\n'
              '| step | autocast | seconds (min-max) | speed against the reference | images/s '
              '| GFLOP per image | MFU | peak memory (GiB) |\n|' + ' --- |' * 8)
        reference_seconds = r['step_seconds']['reference_dino']
        memory = r.get('peak_memory_gib') or {}   # runs before it was measured have none
        for step, seconds in r['step_seconds'].items():
            images, gflop = r['images_per_second'][step], r['gflops_per_image'][step]
            mfu = f'{images * gflop / (peak * 1e3):.1%}' if peak else 'n/a'
            gib = memory.get(step)
            print(f'| {step} | {autocast_dtype(r, step)} | {median_range(r["step_spread"][step])} '
                  f'| {reference_seconds / seconds:.3f} | {images:.1f} | {gflop:.1f} | {mfu} '
                  f'| {"n/a" if gib is None else f"{gib:.2f}"} |')
        if peak:
            print(f'MFU against a peak of {peak:g} TFLOP/s (--peak-tflops)')
        if memory and all(v is not None for v in memory.values()):
            print('peak memory: what the step keeps (weights, teacher, gradients, optimiser '
                  'state, inputs) plus what one call allocated above it '
                  '(torch.cuda.max_memory_allocated)')
        print(usage_line(r['usage_per_step']))
        if 'dino_mode_speed_vs_reference' in r:   # the docs' rows have no --dtypes
            print(f'docs/benchmarks.md row (threads | DINO mode speed | MST speed | MST / DINO '
                  f'mode | load per core before):\n{name}: {reference_summary_row(results, name)}')


def autocast_dtype(result: dict, step: str) -> str:
    """The autocast dtype a step of a ``--reference-dino`` result ran in: DINO's float16,
    ours per ``--dtypes`` or the AMP wrapper's default (float16 on CUDA); 'off' without AMP."""
    if not result['amp']:
        return 'off'
    if step == 'reference_dino':
        return 'float16'
    return (result.get('dtypes') or {}).get(step) or 'float16'


def main(argv: Optional[List[str]] = None) -> dict:
    """Time what the options ask for, print it and write it to ``--out``; returns it."""
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from mmengine.logging import MMLogger

    import mst_mm  # noqa: F401
    logger = MMLogger.get_current_instance()
    previous_level = logger.level
    logger.setLevel(logging.WARNING)  # no per-parameter lines
    try:
        return _run(args, argv)
    finally:  # the tool also runs in-process (tests): leave the shared logger as it was
        logger.setLevel(previous_level)


def _run(args: argparse.Namespace, argv: Optional[List[str]]) -> dict:
    models = args.models or (['deit-s'] if args.reference_dino else list(MODELS))
    configs = {name: resolve_model(name) for name in models}  # refuse a bad name first
    amp = args.device.startswith('cuda') if args.amp is None else args.amp
    if amp and not args.device.startswith('cuda'):
        raise ValueError("--amp needs --device cuda: DINO's mixed precision is CUDA-only.")
    if args.prototype_precision and args.reference_dino:
        raise ValueError('--prototype-precision and --reference-dino are two different runs.')
    if args.prototype_precision == 'float16' and not args.device.startswith('cuda'):
        raise ValueError("--prototype-precision float16 needs --device cuda: the CPU's "
                         'autocast is bfloat16.')
    if args.dtypes and not (amp and args.reference_dino):
        raise ValueError('--dtypes sets the autocast dtype of our steps against '
                         '--reference-dino: it needs --reference-dino and AMP (--amp, the '
                         'default on CUDA).')

    load = load_per_core()  # before the first timing: what else the machine was doing
    print('1-minute load average per core before timing: '
          + ('unknown' if load is None else f'{load:.2f}'), flush=True)
    results = dict(command='python tools/analysis/benchmark.py ' + ' '.join(
        argv if argv is not None else sys.argv[1:]), commit=git_commit(), machine=machine(),
        device=args.device, repeats=args.repeats, peak_tflops=args.peak_tflops,
        load_per_core_before=load, models={})
    for name, (config, default_batch_size) in configs.items():
        batch_size = args.batch_size or default_batch_size
        print(f'[{name}] timing ...', flush=True)
        if args.reference_dino:
            results['models'][name] = compare_with_reference(
                config, args.reference_dino, batch_size, args.repeats, args.warmup,
                args.device, amp, args.dtypes)
        elif args.prototype_precision:
            results['models'][name] = measure_prototype_precision(
                config, batch_size, args.repeats, args.warmup, args.device,
                args.prototype_precision)
        else:
            results['models'][name] = measure_steps(load_variants(config), batch_size,
                                                    args.repeats, args.warmup, args.device)

    (print_reference_table if args.reference_dino else print_prototype_precision_table
     if args.prototype_precision else print_cost_table)(results)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=2)
    print(f'\nwritten to {args.out}')
    return results


if __name__ == '__main__':
    main()
