"""The original DINO training step (facebookresearch/dino's ``main_dino.py``, imported from a
clone at run time: nothing of DINO's is copied here) against our DINO mode and MST on the
same crops (``projects/mst_research/tools/benchmark.py --reference-dino``)."""
import importlib.util
import math
import os.path as osp
import sys
import tempfile
from functools import partial
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmpretrain.registry import MODELS as REGISTRY

from mst_research import bench
from mst_research.step_cost import build_for_training, crop_settings, load_variants, synthetic_batch

# The modules of a DINO clone that the reference step uses, in the order they import one
# another by top-level name (vision_transformer imports utils, main_dino both).
REFERENCE_MODULES = ('utils', 'vision_transformer', 'main_dino')
# mmpretrain ViT arch -> DINO's constructor (mmpretrain's 'small' is 768 wide and 8 deep,
# not DINO's ViT-S: only the DeiT names and base match)
REFERENCE_ARCHS = {'deit-t': 'vit_tiny', 'deit-tiny': 'vit_tiny', 'deit-s': 'vit_small',
                   'deit-small': 'vit_small', 'deit-b': 'vit_base', 'deit-base': 'vit_base',
                   'b': 'vit_base', 'base': 'vit_base'}
# ratio in the JSON -> (numerator, denominator); speed is reference seconds / ours
REFERENCE_RATIOS = {'dino_mode_speed_vs_reference': ('reference_dino', 'dino_mode'),
                    'mst_speed_vs_reference': ('reference_dino', 'mst'),
                    'mst_over_dino_mode': ('mst', 'dino_mode')}


def import_reference_dino(folder: str) -> dict:
    """A DINO clone's modules by name, loaded from its files. As they import each other by
    top-level name, each is in ``sys.modules`` under that name while the next one loads;
    afterwards ``sys.modules`` is as it was."""
    folder = osp.abspath(folder)
    missing = [f'{name}.py' for name in REFERENCE_MODULES
               if not osp.isfile(osp.join(folder, f'{name}.py'))]
    if missing:
        raise FileNotFoundError(
            f'--reference-dino {folder} is not a clone of facebookresearch/dino: it lacks '
            f'{", ".join(missing)}. Clone it with `git clone '
            "https://github.com/facebookresearch/dino` and pass the clone's root folder.")
    saved = {name: sys.modules.pop(name) for name in REFERENCE_MODULES if name in sys.modules}
    modules = {}
    try:
        for name in REFERENCE_MODULES:
            spec = importlib.util.spec_from_file_location(name, osp.join(folder, f'{name}.py'))
            modules[name] = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[name])
        return modules
    finally:
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
        modules = import_reference_dino(dino_dir)
        main_dino, utils, vits = (modules[name] for name in
                                  ('main_dino', 'utils', 'vision_transformer'))
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
        # torch.amp.GradScaler from torch 2.3; torch.cuda.amp's before.
        scaler = getattr(torch.amp, 'GradScaler', None)
        self.scaler = (scaler('cuda') if scaler else torch.cuda.amp.GradScaler()) if amp else None

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
    """Our steps of a ``--reference-dino`` run: name -> (variant of ``load_variants``,
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


def compare_with_reference(config: str, dino_dir: str, batch_size: int, repeats: int,
                           warmup: int, device: str, amp: bool,
                           dtypes: Optional[List[str]] = None) -> dict:
    """The reference step and ours (per dtype), interleaved on the same crops, with their
    ratios, spreads, FLOP counts and (on a GPU) peak memory."""
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
    times, usage = bench.interleaved_times(steps, repeats, warmup, device)
    figures = bench.step_figures(times, usage)
    # A dtype changes no FLOP count: each variant is counted once, in the first dtype.
    flops = dict(reference_dino=bench.flops_of(steps['reference_dino']))
    for name, (variant, _) in names.items():
        counted = next(n for n, (v, _) in names.items() if v == variant)
        flops[name] = flops[counted] if counted in flops else bench.flops_of(steps[name])
    states = dict(reference_dino=reference.state(),
                  **{name: ([model], [optim_wrapper.optimizer])
                     for name, (model, optim_wrapper) in ours.items()})
    inputs = dict(reference_dino=list(normalised),
                  **{name: list(batch['inputs']) for name in ours})
    memory = {name: bench.peak_memory_gib(step, bench.state_bytes(*states[name], inputs[name]),
                                          device)
              for name, step in steps.items()}
    ratios = {key: bench.ratio_over_repetitions(times[num], times[den])
              for key, (num, den) in reference_ratios(dtypes).items()}
    crops = crop_settings(cfg)
    return dict(
        batch_size=batch_size, amp=amp, reference_dino=osp.abspath(dino_dir),
        dtypes={name: dtype for name, (_, dtype) in names.items()} if dtypes else None,
        crops=f'2 x {crops["global_size"]} + {crops["num_local_crops"]} x '
              f'{crops["local_size"]} px',
        out_channels=cfg.model.neck.get('out_channels'),
        **figures,
        images_per_second={name: batch_size / s for name, s in figures['step_seconds'].items()},
        gflops_per_image={name: f / batch_size / 1e9 for name, f in flops.items()},
        peak_memory_gib=memory,
        **{key: ratio for key, (ratio, _) in ratios.items()},
        ratio_range_over_repetitions={key.replace('_vs_reference', ''): ratio_range
                                      for key, (_, ratio_range) in ratios.items()})


def autocast_dtype(result: dict, step: str) -> str:
    """The autocast dtype a step of a ``--reference-dino`` result ran in: DINO's float16,
    ours per ``--dtypes`` or the AMP wrapper's default (float16 on CUDA); 'off' without AMP."""
    if not result['amp']:
        return 'off'
    if step == 'reference_dino':
        return 'float16'
    return (result.get('dtypes') or {}).get(step) or 'float16'


def reference_summary_row(results: dict, name: str) -> str:
    """One ``--reference-dino`` run as a row of docs/benchmarks.md's results table: torch
    threads | DINO mode speed | MST speed | MST / DINO mode | load per core before."""
    r = results['models'][name]
    cells = [str(results['machine']['torch_threads'])]
    for key in REFERENCE_RATIOS:
        cells.append(bench.range_cell(
            r[key], *r['ratio_range_over_repetitions'][key.replace('_vs_reference', '')]))
    return '| ' + ' | '.join(cells + [bench.load_cell(results)]) + ' |'


def print_reference_table(results: dict) -> None:
    """Per model, every step's seconds, speed against the reference, images/s, GFLOP per
    image, MFU (with ``peak_tflops``) and peak memory; then the docs' row."""
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
            print(f'| {step} | {autocast_dtype(r, step)} '
                  f'| {bench.median_range(r["step_spread"][step])} '
                  f'| {reference_seconds / seconds:.3f} | {images:.1f} | {gflop:.1f} | {mfu} '
                  f'| {"n/a" if gib is None else f"{gib:.2f}"} |')
        if peak:
            print(f'MFU against a peak of {peak:g} TFLOP/s (--peak-tflops)')
        if memory and all(v is not None for v in memory.values()):
            print('peak memory: what the step keeps (weights, teacher, gradients, optimiser '
                  'state, inputs) plus what one call allocated above it '
                  '(torch.cuda.max_memory_allocated)')
        print(bench.usage_line(r['usage_per_step']))
        if 'dino_mode_speed_vs_reference' in r:   # the docs' rows have no --dtypes
            print(f'docs/benchmarks.md row (threads | DINO mode speed | MST speed | MST / DINO '
                  f'mode | load per core before):\n{name}: {reference_summary_row(results, name)}')
