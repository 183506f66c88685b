"""What MST costs over DINO, and how our step compares with the original DINO code.

    python tools/analysis/benchmark.py [--models tiny deit-s swin-t CONFIG.py ...]
        [--repeats 5] [--batch-size deit-s=16] [--device cpu|cuda] [--out FILE.json]

    python tools/analysis/benchmark.py --reference-dino /path/to/dino --models deit-s \\
        --batch-size 4 --threads 2

Every timing is interleaved (the variants take turns inside every repetition, in a rotating
order, so that drifts of a noisy machine hit all of them alike) and reported as medians.

Without ``--reference-dino``, for every model (a built-in name or a config path):

(a) ``step``: one full training step (data preprocessing, forward, backward, AdamW, EMA)
    of MST against the DINO baseline built from the same config with masking and decoder
    off, on the same crops and batch; and, between the two, MST with the mask only (the
    decoder off), which splits MST's cost into its two parts: the paper says the mask adds
    no training time.
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

With ``--reference-dino DIR`` (a clone of facebookresearch/dino; its code is imported from
DIR at run time and never copied here), for every model instead: the training step of
DINO's ``main_dino.py`` (teacher and student forward, ``DINOLoss``, backward,
``clip_gradients``, ``cancel_gradients_last_layer``, AdamW on ``get_params_groups``, the
EMA loop), built from DINO's own ``vision_transformer`` and ``utils`` with the config's
backbone, head, crops, K and temperatures, interleaved with our DINO mode (the config with
mask and decoder off) and our MST step on the same crops; with AMP on both sides on CUDA
(DINO's ``autocast`` + ``GradScaler``, our ``--amp`` optimiser wrapper). It reports the
three steps, our speed against the reference's (reference seconds / ours) for both, MST /
DINO mode, the spread of every figure, and the peak memory (e) of each step. ``--scaling``
adds the three steps at batch 4, 8 and 16 (8 local crops) and at 0, 2 and 8 local crops
(batch 4): whether our overhead grows with the work. Each step's floating-point operations
are counted once (``torch.utils.flop_counter``: matrix products, convolutions and attention,
forward and backward) and reported per image with images per second; with
``--peak-tflops`` (the device's dense peak for the step's precision) also the model FLOP
utilisation, MFU = images/s x FLOP per image / peak.

A figure is only as good as the machine was quiet. Every run ends with a verdict
(``quiet`` in the JSON, and a last line saying whether the figures may be published): quiet
when the 1-minute load average before the first timing was at most ``QUIET_LOAD`` per
core (nothing else running) and, for every pair of steps, the ratio of their times taken
inside each repetition stays within ``QUIET_RATIO_SPREAD`` of its median ((max - min) /
median). The ratios are what is published; the seconds themselves are not judged, because
a shared VM's speed drifts by 10-15 % within minutes (seen on this project's machine, with
nothing else running in it), which interleaving cancels in the ratios but not in the times.
A noisy run is marked as such in its JSON and its output; the README and docs/benchmarks.md
quote quiet runs only.

Speeds are never asserted in tests; ``tests/test_benchmark.py`` runs this tool on the tiny
model (and on a stand-in for DINO's code) and checks the JSON.
"""
import argparse
import copy
import importlib
import inspect
import itertools
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
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)
from mst_mm.models import DINO_MODE  # noqa: E402

# name: (pretraining config, default batch size per step on CPU)
MODELS = {
    'tiny': ('configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py', 64),
    'deit-s': ('configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 16),
    'swin-t': ('configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py', 16),
}
DEFAULT_BATCH_SIZE = 16  # for a config path without a --batch-size
MASK_ONLY_OVERRIDES = dict(decoder_head=None)
TARGETS = dict(step=1.10, attention=1.02)
# The modules of a facebookresearch/dino clone that the reference step uses.
REFERENCE_MODULES = ('main_dino', 'utils', 'vision_transformer')
# mmpretrain ViT arch -> DINO's constructor in vision_transformer.py (mmpretrain's 'small'
# is 768 wide and 8 deep, not DINO's ViT-S: only the DeiT names and base match)
REFERENCE_ARCHS = {'deit-t': 'vit_tiny', 'deit-tiny': 'vit_tiny',
                   'deit-s': 'vit_small', 'deit-small': 'vit_small',
                   'deit-b': 'vit_base', 'deit-base': 'vit_base', 'b': 'vit_base',
                   'base': 'vit_base'}
STEP_NAMES = ('reference_dino', 'dino_mode', 'mst')
# --scaling: (batch, local crops) points, to show how each step grows with the work.
SCALING_POINTS = ((4, 0), (4, 2), (4, 8), (8, 8), (16, 8))
# The quiet-machine rule (module docstring): load per core before timing, and the spread of
# every ratio of two steps over the repetitions.
QUIET_LOAD = 0.25
QUIET_RATIO_SPREAD = 0.20


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
    parser.add_argument('--batch-size', nargs='+', default=[], metavar='[MODEL=]N',
                        help='images per step: N for every model, or MODEL=N for one (MODEL '
                        'as given to --models), e.g. deit-s=32; defaults: '
                        + ', '.join(f'{k}={v}' for k, (_, v) in MODELS.items())
                        + f', a config path {DEFAULT_BATCH_SIZE}')
    parser.add_argument('--pipeline-images', type=int, default=16,
                        help='images per timed pass of the data pipeline (d)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='where the steps run: cpu or cuda')
    parser.add_argument('--threads', type=int, default=None,
                        help='torch CPU threads (torch.set_num_threads), also in the memory '
                        "probes; default: torch's own choice")
    parser.add_argument('--decoder-channels', type=int, nargs='+', metavar='C',
                        help='override the decoder widths of every model, e.g. 64 32 16 8')
    parser.add_argument('--reference-dino', metavar='DIR',
                        help='a clone of facebookresearch/dino: time its main_dino.py step '
                        'against our DINO mode and MST instead of (a)-(e)')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help='mixed precision on both sides of --reference-dino (DINO\'s '
                        'autocast + GradScaler, our AMP optimiser wrapper); default: on '
                        'with CUDA, off on the CPU')
    parser.add_argument('--scaling', action='store_true',
                        help='with --reference-dino: also time the three steps at batch 4, 8 '
                        'and 16 (8 local crops) and at 0, 2 and 8 local crops (batch 4), to '
                        'show how each grows with the work')
    parser.add_argument('--peak-tflops', type=float, default=None,
                        help="with --reference-dino: the device's dense peak in TFLOP/s for "
                        'the precision used (e.g. 989 for an H100/H200 in bf16/fp16), to '
                        'report the model FLOP utilisation of each step')
    parser.add_argument('--skip-memory', action='store_true',
                        help='skip the peak-memory probes (e)')
    parser.add_argument('--out', default='work_dirs/benchmark/benchmark.json',
                        help='the JSON file that receives every figure')
    parser.add_argument('--memory-probe', help=argparse.SUPPRESS)  # internal: one child run
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def resolve_model(name: str) -> Tuple[str, int]:
    """(config path relative to the repository or absolute, default batch) of a --models entry.

    Args:
        name (str): A key of ``MODELS`` or the path of a config file.
    """
    if name in MODELS:
        return MODELS[name]
    if osp.isfile(name) or osp.isfile(osp.join(REPO, name)):
        return name, DEFAULT_BATCH_SIZE
    raise ValueError(f'--models takes built-in names ({", ".join(MODELS)}) or paths of '
                     f'config files; {name!r} is neither.')


def config_path(config: str) -> str:
    return config if osp.isfile(config) else osp.join(REPO, config)


def batch_sizes_for(models: List[str], options: List[str]) -> Dict[str, int]:
    """The batch of every model from the built-in defaults and ``--batch-size`` options."""
    sizes = {name: resolve_model(name)[1] for name in models}
    for item in options:
        name, sep, value = item.rpartition('=')
        if not value.isdigit() or int(value) < 1 or (sep and name not in sizes):
            raise ValueError(f'--batch-size takes N or MODEL=N with N >= 1 and MODEL one of '
                             f'--models {models}, got {item!r}.')
        for key in ([name] if sep else models):
            sizes[key] = int(value)
    return sizes


def load_variants(config: str, decoder_channels: Optional[List[int]] = None,
                  num_local_crops: Optional[int] = None) -> Dict[str, Config]:
    """The config's model as MST, the DINO baseline (no mask, no decoder) and MST with the
    mask only (no decoder) from it; optionally with other decoder widths or another number
    of local crops."""
    mst = Config.fromfile(config_path(config))
    if decoder_channels:
        mst.model.decoder_head.channels = tuple(decoder_channels)
    if num_local_crops is not None:
        multicrop_step(mst)['num_local_crops'] = num_local_crops
    dino, mask_only = copy.deepcopy(mst), copy.deepcopy(mst)
    dino.merge_from_dict(dict(model=DINO_MODE))
    mask_only.merge_from_dict(dict(model=MASK_ONLY_OVERRIDES))
    return dict(dino=dino, mask_only=mask_only, mst=mst)


def multicrop_step(cfg: Config) -> dict:
    """The MultiCrop step of the config's train pipeline (the dict itself, to edit)."""
    for step in cfg.train_dataloader.dataset.pipeline:
        if step['type'] == 'MultiCrop':
            return step
    raise ValueError('The config\'s train pipeline has no MultiCrop.')


def crop_settings(cfg: Config) -> dict:
    """global_size / local_size / num_local_crops of the config's MultiCrop."""
    from mst_mm.datasets import MultiCrop
    defaults = {k: p.default for k, p in inspect.signature(MultiCrop).parameters.items()}
    return {**defaults, **{k: v for k, v in multicrop_step(cfg).items() if k != 'type'}}


def synthetic_batch(cfg: Config, batch_size: int, seed: int = 0, device: str = 'cpu') -> dict:
    """Random 0-255 crops of the config's sizes, one (B, 3, S, S) tensor per view."""
    crops = crop_settings(cfg)
    gen = torch.Generator().manual_seed(seed)
    sizes = [crops['global_size']] * 2 + [crops['local_size']] * crops['num_local_crops']
    views = [torch.randint(0, 256, (batch_size, 3, s, s), generator=gen).float().to(device)
             for s in sizes]
    return dict(inputs=views, data_samples=None)


def build_for_training(cfg: Config, device: str, seed: int = 0, amp: bool = False):
    """The config's model on ``device`` in training mode, and its optimiser wrapper."""
    from mmengine.logging import MessageHub
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS as REGISTRY

    from mst_mm.engine.optimizers import AMP_OPTIM_WRAPPERS
    MessageHub.get_current_instance().update_info('max_iters', 10_000)  # CosineEMA reads it
    torch.manual_seed(seed)
    model = REGISTRY.build(cfg.model)
    model.init_weights()
    model.to(device).train()
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    if amp:
        optim_cfg.type = AMP_OPTIM_WRAPPERS[optim_cfg.get('type', 'OptimWrapper')]
    # The config's scope, as the runner sets it: mst_mm's constructors register there.
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmpretrain')):
        return model, build_optim_wrapper(model, optim_cfg)


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def interleaved_times(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                      device: str, usage: Optional[Dict[str, List[Dict[str, float]]]] = None
                      ) -> Dict[str, List[float]]:
    """Seconds of every repetition of each function; the order rotates every repetition.

    Args:
        usage (dict, optional): If given, also receives what this process spent in every
            repetition (all threads), from ``getrusage``: ``user`` and ``system`` CPU
            seconds and ``minor_faults`` (pages first touched). Other processes on a shared
            machine disturb these far less than the wall clock; the system time is mostly
            the page faults of the allocator handing large buffers back to the kernel and
            getting them again.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    if usage is not None:
        usage.update({name: [] for name in fns})
    names = list(fns)
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            _sync(device)
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            fns[name]()
            _sync(device)
            times[name].append(time.perf_counter() - start)
            if usage is not None:
                after = resource.getrusage(resource.RUSAGE_SELF)
                usage[name].append(dict(user=after.ru_utime - before.ru_utime,
                                        system=after.ru_stime - before.ru_stime,
                                        minor_faults=after.ru_minflt - before.ru_minflt))
    return times


def usage_medians(usage: Dict[str, List[Dict[str, float]]]) -> Dict[str, Dict[str, float]]:
    """Per step, the medians over the repetitions of :func:`interleaved_times`'s usage."""
    return {name: {key: statistics.median(u[key] for u in reps) for key in reps[0]}
            for name, reps in usage.items()}


def usage_line(used: Dict[str, Dict[str, float]]) -> str:
    return 'per step, median: ' + ', '.join(
        f'{step} user {u["user"]:.3f} s, system {u["system"]:.3f} s, '
        f'{u["minor_faults"]:.0f} page faults' for step, u in used.items())


def interleaved_medians(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                        device: str) -> Dict[str, float]:
    """Median seconds of each function, timed by :func:`interleaved_times`."""
    times = interleaved_times(fns, repeats, warmup, device)
    return {name: statistics.median(t) for name, t in times.items()}


def measure_steps(variants: Dict[str, Config], batch_size: int, repeats: int, warmup: int,
                  device: str) -> dict:
    """(a), (b) and (c) for one model."""
    built = {name: build_for_training(cfg, device) for name, cfg in variants.items()}
    batch = synthetic_batch(variants['mst'], batch_size, device=device)

    def step_fn(name):
        model, optim_wrapper = built[name]
        return lambda: model.train_step(batch, optim_wrapper)

    usage: Dict[str, List[Dict[str, float]]] = {}
    times = interleaved_times({name: step_fn(name) for name in built}, repeats, warmup, device,
                              usage)
    step = {name: statistics.median(t) for name, t in times.items()}

    def ratio_range(variant: str) -> List[float]:
        per_rep = [v / d for v, d in zip(times[variant], times['dino'])]
        return [min(per_rep), max(per_rep)]

    mst = built['mst'][0]
    preprocessed = mst.data_preprocessor(batch, training=True)['inputs']
    global_crops = torch.cat(preprocessed[:mst.num_global_crops])
    teacher_backbone = mst.teacher.module[0]
    teacher_backbone.eval()  # mmpretrain's ViT.train() does not return self

    def teacher_forward(with_attn: bool):
        def run():
            with torch.no_grad():
                teacher_backbone.forward_mst(global_crops, with_attn=with_attn,
                                             with_patches=False)
        return run

    attention = interleaved_medians(
        dict(without=teacher_forward(False), with_attn=teacher_forward(True)),
        repeats * 3, warmup, device)

    result = dict(
        batch_size=batch_size,
        step_seconds=step, step_ratio=step['mst'] / step['dino'],
        step_spread={name: _spread(t) for name, t in times.items()},
        step_ratio_range_over_repetitions=ratio_range('mst'),
        mask_only_ratio=step['mask_only'] / step['dino'],
        mask_only_ratio_range_over_repetitions=ratio_range('mask_only'),
        usage_per_step=usage_medians(usage),
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


# ---------------------------------------------------------------- the reference DINO step

def flops_of(fn: Callable[[], None]) -> int:
    """Floating-point operations of one call of ``fn`` (forward and backward), counted.

    Attention runs on the math backend here: torch's counter has no formula for the CPU's
    fused attention kernel and would count its matrix products as zero.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        fn()
    return counter.get_total_flops()


def import_reference_dino(folder: str) -> dict:
    """Import ``main_dino``, ``utils`` and ``vision_transformer`` from a DINO clone.

    DINO's scripts import each other by top-level name (``import utils``), so the folder
    goes first on ``sys.path`` for the import; afterwards ``sys.path`` and any modules of the
    same names that were loaded before are restored, and the reference's modules live on
    only through the objects built from them.

    Args:
        folder (str): The root of a facebookresearch/dino clone.

    Returns:
        dict: The three modules by name.
    """
    folder = osp.abspath(folder)
    missing = [f'{name}.py' for name in REFERENCE_MODULES
               if not osp.isfile(osp.join(folder, f'{name}.py'))]
    if missing:
        raise FileNotFoundError(
            f'--reference-dino {folder} is not a clone of facebookresearch/dino: it lacks '
            f'{", ".join(missing)}. Clone it with `git clone '
            'https://github.com/facebookresearch/dino` and pass the clone\'s root folder.')
    saved = {name: sys.modules.pop(name) for name in REFERENCE_MODULES if name in sys.modules}
    sys.path.insert(0, folder)
    try:
        return {name: importlib.import_module(name) for name in REFERENCE_MODULES}
    finally:
        sys.path.remove(folder)
        for name in REFERENCE_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def _one_process_group(device: str) -> None:
    """DINO's loss all-reduces its centre: give it a process group of one rank."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    store = osp.join(tempfile.mkdtemp(prefix='dino_reference_pg_'), 'store')
    backend = 'nccl' if device.startswith('cuda') else 'gloo'
    dist.init_process_group(backend, init_method=f'file://{store}', rank=0, world_size=1)


class ReferenceDINOStep:
    """``main_dino.py``'s training step, built from a user's DINO clone with our config's
    settings, as a callable that runs one step.

    Everything that makes up the step is DINO's own code: ``vision_transformer`` (the ViT
    and ``DINOHead``), ``utils`` (``MultiCropWrapper``, ``get_params_groups``,
    ``clip_gradients``, ``cancel_gradients_last_layer``) and ``main_dino.DINOLoss``. Only
    the order of calls of ``train_one_epoch``'s loop body is restated here, because the
    loop itself needs DINO's data loader and a GPU. Single-process differences from a
    multi-GPU DINO run, which apply to our side alike: no DDP wrapper and plain BatchNorm
    instead of SyncBatchNorm.

    Args:
        dino_dir (str): The root of a facebookresearch/dino clone.
        cfg (Config): Our pretraining config: the backbone arch, patch size and drop path,
            the neck's widths, BN and ``norm_last_layer``, the head's temperatures and
            centre momentum, the optimiser's lr, weight decay and clipping, the teacher
            momentum and the number of crops are taken from it.
        device (str): ``'cpu'`` or ``'cuda'``.
        amp (bool): DINO's ``--use_fp16``: autocast and a ``GradScaler`` (CUDA only).
        seed (int): Seed of the initial weights.
    """

    def __init__(self, dino_dir: str, cfg: Config, device: str, amp: bool = False,
                 seed: int = 0) -> None:
        modules = import_reference_dino(dino_dir)
        main_dino, utils, vits = (modules[name] for name in REFERENCE_MODULES)
        model, backbone, neck, head = cfg.model, cfg.model.backbone, cfg.model.neck, \
            cfg.model.head
        if backbone.get('type') != 'MaskViT':
            raise ValueError(
                '--reference-dino compares ViTs only (DINO has no Swin); this config\'s '
                f'backbone is {backbone.get("type")}. Use a ViT config such as deit-s.')
        head_kwargs = dict(use_bn=neck.get('with_bn', True), nlayers=neck.get('num_layers', 3),
                           hidden_dim=neck.get('hidden_channels', 2048),
                           bottleneck_dim=neck.get('bottleneck_channels', 256))
        out_dim = neck.get('out_channels', 65536)
        _one_process_group(device)
        torch.manual_seed(seed)
        student = reference_vit(vits, backbone, backbone.get('drop_path_rate', 0.))
        teacher = reference_vit(vits, backbone, 0.)
        embed_dim = student.embed_dim
        self.student = utils.MultiCropWrapper(student, vits.DINOHead(
            embed_dim, out_dim, norm_last_layer=neck.get('norm_last_layer', True),
            **head_kwargs)).to(device)
        self.teacher = utils.MultiCropWrapper(teacher, vits.DINOHead(
            embed_dim, out_dim, **head_kwargs)).to(device)
        self.teacher.load_state_dict(self.student.state_dict())
        for param in self.teacher.parameters():
            param.requires_grad = False

        crops = crop_settings(cfg)
        teacher_temp = head.get('teacher_temp', 0.04)
        # A one-epoch schedule at the config's starting temperature, as at iteration 0.
        self.dino_loss = main_dino.DINOLoss(
            out_dim, 2 + crops['num_local_crops'], teacher_temp, teacher_temp, 0, 1,
            student_temp=head.get('student_temp', 0.1),
            center_momentum=head.get('center_momentum', 0.9)).to(device)
        self.optimizer = torch.optim.AdamW(utils.get_params_groups(self.student))
        optimizer_cfg = cfg.optim_wrapper.optimizer
        self.lr, self.weight_decay = optimizer_cfg.lr, optimizer_cfg.get('weight_decay', 0.04)
        clip = cfg.optim_wrapper.get('clip_grad') or {}
        self.clip_grad = clip.get('max_norm', 0.)
        self.momentum = 1 - model.get('base_momentum', 0.004)  # DINO's convention
        self.utils = utils
        self.device = device
        self.amp = amp
        self.scaler = torch.amp.GradScaler('cuda') if amp else None
        self.epoch, self.freeze_last_layer = 0, 0  # the last layer is trained, as ours is

    def __call__(self, images: List[torch.Tensor]) -> float:
        """One step on normalised crops (global crops first); returns the loss."""
        for i, group in enumerate(self.optimizer.param_groups):
            group['lr'] = self.lr
            if i == 0:  # DINO regularises the first group only
                group['weight_decay'] = self.weight_decay
        with torch.autocast(device_type='cuda' if self.device.startswith('cuda') else 'cpu',
                            enabled=self.amp):
            teacher_output = self.teacher(images[:2])
            student_output = self.student(images)
            loss = self.dino_loss(student_output, teacher_output, self.epoch)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f'The reference DINO step gave a loss of {loss.item()}.')
        self.optimizer.zero_grad()
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            if self.clip_grad:
                self.scaler.unscale_(self.optimizer)
        if self.clip_grad:
            self.utils.clip_gradients(self.student, self.clip_grad)
        self.utils.cancel_gradients_last_layer(self.epoch, self.student, self.freeze_last_layer)
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


def reference_vit(vits, backbone: dict, drop_path_rate: float) -> torch.nn.Module:
    """DINO's ViT for our backbone config: its named constructor for a named arch
    (``deit-small`` -> ``vit_small``), else its ``VisionTransformer`` with the arch's
    widths (as DINO's constructors build it: qkv bias, LayerNorm eps 1e-6).

    Args:
        vits (module): DINO's ``vision_transformer``.
        backbone (dict): Our ``MaskViT`` config.
        drop_path_rate (float): Stochastic depth (the teacher has none).
    """
    from functools import partial
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


def normalised_crops(cfg: Config, batch: dict, device: str) -> List[torch.Tensor]:
    """The crops as the config's data preprocessor hands them to the model.

    The reference step gets them already normalised, as DINO's data loader normalises in
    its workers; our step normalises them itself (its data preprocessor is part of it).
    """
    from mmpretrain.registry import MODELS as REGISTRY
    preprocessor = REGISTRY.build(cfg.model.data_preprocessor).to(device)
    with torch.no_grad():
        return preprocessor(batch, training=True)['inputs']


def _median_range(spread: dict) -> str:
    """'median (min-max)' of a :func:`_spread` result, in seconds."""
    return f'{spread["median"]:.3f} ({spread["min"]:.3f}-{spread["max"]:.3f})'


def _spread(times: List[float]) -> dict:
    median = statistics.median(times)
    return dict(median=median, min=min(times), max=max(times),
                spread=(max(times) - min(times)) / median, all=times)


def compare_with_reference(config: str, dino_dir: str, batch_size: int, repeats: int,
                           warmup: int, device: str, amp: bool,
                           decoder_channels: Optional[List[int]] = None,
                           num_local_crops: Optional[int] = None) -> dict:
    """The three steps, interleaved on the same crops, with their ratios and spreads."""
    variants = load_variants(config, decoder_channels, num_local_crops)
    ours = {name: build_for_training(variants[variant], device, amp=amp)
            for name, variant in (('dino_mode', 'dino'), ('mst', 'mst'))}
    reference = ReferenceDINOStep(dino_dir, variants['mst'], device, amp)
    batch = synthetic_batch(variants['mst'], batch_size, device=device)
    normalised = normalised_crops(variants['mst'], batch, device)

    def our_step(name):
        model, optim_wrapper = ours[name]
        return lambda: model.train_step(batch, optim_wrapper)

    usage: Dict[str, List[Dict[str, float]]] = {}
    times = interleaved_times(dict(reference_dino=lambda: reference(normalised),
                                   dino_mode=our_step('dino_mode'), mst=our_step('mst')),
                              repeats, warmup, device, usage)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    cpu = {name: statistics.median(u['user'] + u['system'] for u in reps)
           for name, reps in usage.items()}
    flops = dict(reference_dino=flops_of(lambda: reference(normalised)),
                 **{name: flops_of(our_step(name)) for name in ours})
    per_rep = {  # ratios inside each repetition: the noise of the ratios themselves
        'dino_mode_speed': [r / d for r, d in zip(times['reference_dino'], times['dino_mode'])],
        'mst_speed': [r / m for r, m in zip(times['reference_dino'], times['mst'])],
        'mst_over_dino_mode': [m / d for m, d in zip(times['mst'], times['dino_mode'])]}
    crops = crop_settings(variants['mst'])
    return dict(
        batch_size=batch_size, amp=amp, reference_dino=osp.abspath(dino_dir),
        crops=f'2 x {crops["global_size"]} + {crops["num_local_crops"]} x '
              f'{crops["local_size"]} px',
        out_channels=variants['mst'].model.neck.get('out_channels'),
        step_seconds=seconds,
        images_per_second={name: batch_size / s for name, s in seconds.items()},
        gflops_per_image={name: f / batch_size / 1e9 for name, f in flops.items()},
        step_spread={name: _spread(t) for name, t in times.items()},
        # speed against the reference: reference seconds / our seconds (> 1: we are faster)
        dino_mode_speed_vs_reference=seconds['reference_dino'] / seconds['dino_mode'],
        mst_speed_vs_reference=seconds['reference_dino'] / seconds['mst'],
        mst_over_dino_mode=seconds['mst'] / seconds['dino_mode'],
        ratio_range_over_repetitions={k: [min(v), max(v)] for k, v in per_rep.items()},
        # The same from this process's CPU time (all threads): on a machine shared with
        # other work it moves far less than the wall clock; spinning threads count in it.
        cpu_seconds=cpu,
        usage_per_step=usage_medians(usage),
        cpu_dino_mode_speed_vs_reference=cpu['reference_dino'] / cpu['dino_mode'],
        cpu_mst_speed_vs_reference=cpu['reference_dino'] / cpu['mst'],
        cpu_mst_over_dino_mode=cpu['mst'] / cpu['dino_mode'])


# ---------------------------------------------------------------------------- pipeline

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


# ------------------------------------------------------------------------------ memory

def peak_step_memory(config: str, variant: str, batch_size: int, device: str,
                     decoder_channels: Optional[List[int]] = None, **extra) -> float:
    """(e) in MiB, measured in a fresh process so that earlier runs leave no peak behind.

    Args:
        variant (str): ``'dino'``, ``'mst'`` or ``'reference_dino'`` (then ``extra`` holds
            ``reference_dino``, the clone's folder).
        extra: ``threads``, ``amp`` and ``reference_dino``, passed to the probe.
    """
    probe = json.dumps(dict(config=config_path(config), variant=variant,
                            batch_size=batch_size, device=device,
                            decoder_channels=decoder_channels, **extra))
    out = subprocess.run([sys.executable, osp.abspath(__file__), '--memory-probe', probe],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f'The memory probe of {variant} failed:\n{out.stderr[-3000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])['peak_mib']


def _resident_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _memory_probe(spec: dict) -> None:
    import mst_mm  # noqa: F401
    if spec.get('threads'):
        torch.set_num_threads(spec['threads'])
    device, amp = spec['device'], spec.get('amp', False)
    variant = spec['variant']
    cfg = load_variants(spec['config'], spec['decoder_channels'])[
        'mst' if variant == 'reference_dino' else variant]
    batch = synthetic_batch(cfg, spec['batch_size'], device=device)
    if variant == 'reference_dino':
        reference = ReferenceDINOStep(spec['reference_dino'], cfg, device, amp)
        images = normalised_crops(cfg, batch, device)

        def step():
            reference(images)
    else:
        model, optim_wrapper = build_for_training(cfg, device, amp=amp)

        def step():
            model.train_step(batch, optim_wrapper)

    if device.startswith('cuda'):
        step()  # optimiser state exists from here on, as on the CPU
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        step()  # optimiser state exists from here on
        base = _resident_bytes()
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _resident_bytes())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        step()
        done.set()
        sampler.join()
        peak = peak[0] - base
    print(json.dumps(dict(peak_mib=peak / 2**20)))


def load_per_core() -> Optional[float]:
    """The 1-minute load average per core, or None where the system does not tell."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return None


def quiet_verdict(load: Optional[float], results: dict) -> dict:
    """Whether a run's figures may be published: the rule of the module docstring.

    Args:
        load (float | None): :func:`load_per_core` before the first timing.
        results (dict): The run's results, with each model's step times.

    Returns:
        dict: ``quiet`` (bool) and ``reasons`` (why not, one line each).
    """
    reasons = []
    if load is None:
        reasons.append('the load average is unknown on this system')
    elif load > QUIET_LOAD:
        reasons.append(f'the 1-minute load average was {load:.2f} per core before timing '
                       f'(at most {QUIET_LOAD} when nothing else runs)')
    for name, result in results['models'].items():
        points = [('', result)] + [
            (f' (batch {p["batch_size"]}, {p["num_local_crops"]} local crops)', p)
            for p in result.get('scaling', [])]
        for where, point in points:
            times = {step: spread['all']
                     for step, spread in (point.get('step_spread') or {}).items()}
            for first, second in itertools.combinations(times, 2):
                ratios = [b / a for a, b in zip(times[first], times[second])]
                spread = (max(ratios) - min(ratios)) / statistics.median(ratios)
                if spread > QUIET_RATIO_SPREAD:
                    reasons.append(f'{name} {second} / {first}{where}: the ratio spread over '
                                   f'{spread:.0%} of its median over the repetitions (at most '
                                   f'{QUIET_RATIO_SPREAD:.0%})')
    return dict(quiet=not reasons, reasons=reasons, load_per_core_before=load)


def machine() -> dict:
    info = dict(platform=platform.platform(), cpu=cpu_model(),
                python=platform.python_version(), torch=torch.__version__,
                cpus=os.cpu_count(), torch_threads=torch.get_num_threads())
    if torch.cuda.is_available():
        info['gpu'] = torch.cuda.get_device_name()
    return info


def cpu_model() -> str:
    """The CPU's name as the kernel gives it (another CPU gives other ratios)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown'


def git_commit() -> Optional[str]:
    """The repository's commit, with ``+dirty`` when tracked files differ from it."""
    try:
        commit = subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', '-C', REPO, 'status', '--porcelain',
                                '--untracked-files=no'],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ('+dirty' if dirty else '')


COST_HEADER = ('| model | batch | step DINO (s) | step MST (s) | MST / DINO (<= 1.10) '
               '| mask only / DINO | attn fwd ratio (<= 1.02) | decoder share '
               '| pipeline img/s default -> fast | peak MiB DINO / MST |')


def cost_row(name: str, r: dict) -> str:
    """One model's row of the cost table (markdown), as docs/benchmarks.md quotes it."""
    if 'skipped' in r:
        return f'| {name} | skipped: {r["skipped"]} |' + ' |' * 8
    pipe = r['pipeline']['images_per_second']
    memory = r.get('peak_memory_mib', {})
    mem = ' / '.join(f'{memory[v]:.0f}' for v in ('dino', 'mst')) if memory else 'n/a'
    share = f'{r["decoder_share"]:.1%}' if 'decoder_share' in r else 'n/a'
    ratios = []
    for key, range_key in (('step_ratio', 'step_ratio_range_over_repetitions'),
                           ('mask_only_ratio', 'mask_only_ratio_range_over_repetitions')):
        low, high = r[range_key]
        ratios.append(f'{r[key]:.3f} ({low:.3f}-{high:.3f})')
    return (f'| {name} | {r["batch_size"]} '
            f'| {_median_range(r["step_spread"]["dino"])} '
            f'| {_median_range(r["step_spread"]["mst"])} '
            f'| {ratios[0]} | {ratios[1]} '
            f'| {r["attention_ratio"]:.3f} | {share} '
            f'| {pipe["mmpretrain_default"]:.1f} -> {pipe["mst_mm"]:.1f} '
            f'(x{r["pipeline"]["speedup"]:.2f}) | {mem} |')


def print_table(results: dict) -> None:
    print('\nsteps: median (min-max) over the repetitions; ratios: median (range over the '
          'repetitions)')
    print('\n' + COST_HEADER)
    print('|' + ' --- |' * 10)
    for name, r in results['models'].items():
        print(cost_row(name, r))
    for name, r in results['models'].items():
        if 'usage_per_step' in r:
            print(f'{name} {usage_line(r["usage_per_step"])}')


def scaling_rows(result: dict) -> List[str]:
    """The ``--scaling`` table of one model's result, header included (markdown lines)."""
    rows = ['| batch | local crops | reference | ours, DINO mode | ours, MST '
            '| DINO mode speed | MST speed | MST / DINO mode |', '|' + ' --- |' * 8]
    for p in result['scaling']:
        cells = ' | '.join(_median_range(p['step_spread'][s]) for s in STEP_NAMES)
        rows.append(f'| {p["batch_size"]} | {p["num_local_crops"]} | {cells} '
                    f'| {p["dino_mode_speed_vs_reference"]:.3f} '
                    f'| {p["mst_speed_vs_reference"]:.3f} | {p["mst_over_dino_mode"]:.3f} |')
    return rows


def reference_summary_row(results: dict, name: str) -> str:
    """One ``--reference-dino`` run as a row of docs/benchmarks.md's results table.

    Columns: torch threads | DINO mode speed | MST speed | MST / DINO mode (each the median
    with its range over the repetitions) | peak MiB reference / DINO mode / MST | verdict.
    """
    r = results['models'][name]
    ranges = r['ratio_range_over_repetitions']
    cells = [str(results['machine']['torch_threads'])]
    for key, range_key in (('dino_mode_speed_vs_reference', 'dino_mode_speed'),
                           ('mst_speed_vs_reference', 'mst_speed'),
                           ('mst_over_dino_mode', 'mst_over_dino_mode')):
        low, high = ranges[range_key]
        cells.append(f'{r[key]:.3f} ({low:.3f}-{high:.3f})')
    memory = r.get('peak_memory_mib')
    cells.append(' / '.join(f'{memory[s]:.0f}' for s in STEP_NAMES) if memory else 'n/a')
    cells.append('quiet' if results['verdict']['quiet'] else 'NOISY')
    return '| ' + ' | '.join(cells) + ' |'


def print_reference_table(results: dict) -> None:
    for name, r in results['models'].items():
        memory = r.get('peak_memory_mib', {})
        print(f'\n[{name}] batch {r["batch_size"]}, {r["crops"]}, K = {r["out_channels"]}, '
              f'AMP {"on" if r["amp"] else "off"}, median of {results["repeats"]}')
        peak = results.get('peak_tflops')
        print('| step | seconds (min-max) | speed against the reference | images/s '
              '| GFLOP per image | MFU | peak MiB |')
        print('|' + ' --- |' * 7)
        speeds = dict(reference_dino=1.0, dino_mode=r['dino_mode_speed_vs_reference'],
                      mst=r['mst_speed_vs_reference'])
        for step in STEP_NAMES:
            spread = r['step_spread'][step]
            mem = f'{memory[step]:.0f}' if step in memory else 'n/a'
            images, gflop = r['images_per_second'][step], r['gflops_per_image'][step]
            mfu = f'{images * gflop / (peak * 1e3):.1%}' if peak else 'n/a'
            print(f'| {step} | {_median_range(spread)} | {speeds[step]:.3f} | {images:.1f} '
                  f'| {gflop:.1f} | {mfu} | {mem} |')
        if peak:
            print(f'MFU against a peak of {peak:g} TFLOP/s (--peak-tflops)')
        ranges = r['ratio_range_over_repetitions']
        for label, key, range_key in (
                ('our DINO mode, speed against the reference', 'dino_mode_speed_vs_reference',
                 'dino_mode_speed'),
                ('MST, speed against the reference', 'mst_speed_vs_reference', 'mst_speed'),
                ('MST / DINO mode', 'mst_over_dino_mode', 'mst_over_dino_mode')):
            low, high = ranges[range_key]
            print(f'{label}: {r[key]:.3f} (per repetition {low:.3f}-{high:.3f})')
        if 'scaling' in r:
            print('\nscaling: median seconds (min-max); speed against the reference')
            print('\n'.join(scaling_rows(r)))
        cpu = r['cpu_seconds']
        print('process CPU seconds (all threads), median: '
              + ', '.join(f'{step} {cpu[step]:.3f}' for step in STEP_NAMES)
              + f'; speed against the reference {r["cpu_dino_mode_speed_vs_reference"]:.3f} '
              f'(DINO mode), {r["cpu_mst_speed_vs_reference"]:.3f} (MST); MST / DINO mode '
              f'{r["cpu_mst_over_dino_mode"]:.3f}')
        if 'usage_per_step' in r:
            print(usage_line(r['usage_per_step']))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        _memory_probe(json.loads(args.memory_probe))
        return {}
    from mmengine.logging import MMLogger

    import mst_mm  # noqa: F401
    logger = MMLogger.get_current_instance()
    previous_level = logger.level
    logger.setLevel(logging.WARNING)  # no per-parameter lines
    try:
        return _run(args, argv)
    finally:  # the tool also runs in-process (tests): leave the shared logger as it was
        logger.setLevel(previous_level)


def _run(args: argparse.Namespace, argv) -> dict:
    models = args.models or (['deit-s'] if args.reference_dino else list(MODELS))
    batch_sizes = batch_sizes_for(models, args.batch_size)
    amp = args.device.startswith('cuda') if args.amp is None else args.amp
    if amp and not args.device.startswith('cuda'):
        raise ValueError('--amp needs --device cuda: DINO\'s mixed precision is CUDA-only.')

    load = load_per_core()
    results = dict(command='python tools/analysis/benchmark.py ' + ' '.join(
        argv if argv is not None else sys.argv[1:]), commit=git_commit(), machine=machine(),
        device=args.device, repeats=args.repeats, peak_tflops=args.peak_tflops, models={})
    for name in models:
        config, _ = resolve_model(name)
        if not osp.isfile(config_path(config)):
            results['models'][name] = dict(skipped=f'{config} does not exist yet')
            continue
        probe_extra = dict(threads=args.threads, amp=amp)
        if args.reference_dino:
            print(f'[{name}] timing the reference DINO step, our DINO mode and MST ...',
                  flush=True)
            result = compare_with_reference(config, args.reference_dino, batch_sizes[name],
                                            args.repeats, args.warmup, args.device, amp,
                                            args.decoder_channels)
            variants = dict(reference_dino='reference_dino', dino_mode='dino', mst='mst')
            probe_extra['reference_dino'] = osp.abspath(args.reference_dino)
        else:
            print(f'[{name}] timing training steps ...', flush=True)
            variant_cfgs = load_variants(config, args.decoder_channels)
            result = measure_steps(variant_cfgs, batch_sizes[name], args.repeats, args.warmup,
                                   args.device)
            print(f'[{name}] timing the data pipeline ...', flush=True)
            result['pipeline'] = measure_pipeline(variant_cfgs['mst'], args.pipeline_images,
                                                  args.repeats)
            variants = dict(dino='dino', mst='mst')
        if not args.skip_memory:
            print(f'[{name}] peak memory ...', flush=True)
            result['peak_memory_mib'] = {
                key: peak_step_memory(config, variant, batch_sizes[name], args.device,
                                      args.decoder_channels, **probe_extra)
                for key, variant in variants.items()}
        if args.scaling and args.reference_dino:
            print(f'[{name}] scaling with batch and local crops ...', flush=True)
            result['scaling'] = []
            for batch, crops in SCALING_POINTS:
                point = compare_with_reference(config, args.reference_dino, batch, args.repeats,
                                               args.warmup, args.device, amp,
                                               args.decoder_channels, crops)
                result['scaling'].append(dict(
                    batch_size=batch, num_local_crops=crops,
                    **{key: point[key] for key in ('step_spread', 'dino_mode_speed_vs_reference',
                                                   'mst_speed_vs_reference',
                                                   'mst_over_dino_mode')}))
        results['models'][name] = result

    if args.reference_dino:
        print_reference_table(results)
    else:
        print_table(results)
    results['verdict'] = quiet_verdict(load, results)
    if args.reference_dino:
        print('\ndocs/benchmarks.md rows (threads | DINO mode speed | MST speed | MST / DINO '
              'mode | peak MiB | verdict):')
        for name in results['models']:
            if 'skipped' not in results['models'][name]:
                print(f'{name}: {reference_summary_row(results, name)}')
    if results['verdict']['quiet']:
        print(f'\nQUIET: a figure that may be published, with this command and commit '
              f'{results["commit"]}.')
    else:
        print('\nNOISY, do not publish these figures: '
              + '; '.join(results['verdict']['reasons']) + '.')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=2)
    print(f'\nwritten to {args.out}')
    return results


if __name__ == '__main__':
    main()
