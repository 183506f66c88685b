"""The evidence recipe's pretraining end to end, this checkout against another
(projects/mst_research/tools/benchmark_recipe.py): each run is a fresh process that trains
on one core in its checkout, with that checkout's own ``mst_mm`` and recipe, and times every
part of an iteration (:func:`split_iterations`) and its MFU. docs/benchmarks.md explains the
figures.
"""
import importlib
import json
import os
import os.path as osp
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from torch.utils.flop_counter import FlopCounterMode

from mst_research import bench

VARIANTS = ('dino', 'mst_guided_mask')
PARTS = ('loader', 'preprocess', 'step', 'hooks')


def checkout_env(checkout: str) -> Tuple[Dict[str, str], str]:
    """The environment of a run of ``checkout``'s code on one core, and its recipe module.
    ``PYTHONPATH`` puts the checkout first, so that its own ``mst_mm`` is imported, then its
    kit (whose ``recipes`` and this module then run it) or, before the kit, its tools/."""
    kit = osp.join(checkout, 'projects', 'mst_research')
    if osp.isdir(kit):
        paths, recipe = [checkout, kit], 'mst_research.recipes'
    elif osp.isfile(osp.join(checkout, 'tools', 'evidence.py')):
        paths, recipe = [checkout, osp.join(checkout, 'tools')], 'evidence'
    else:
        raise SystemExit(f'{checkout} is not a checkout of this project (no '
                         'projects/mst_research/ nor tools/evidence.py): make one with git '
                         'worktree add DIR COMMIT')
    inherited = [os.environ['PYTHONPATH']] if os.environ.get('PYTHONPATH') else []
    return dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
                PYTHONPATH=os.pathsep.join(paths + inherited)), recipe


def split_iterations(stamps: List[Dict[str, float]]) -> Dict[str, List[float]]:
    """Per iteration, seconds of each part from the stamps the timing hooks took: ``start``
    (first hook before the iteration), ``end`` (last hook after it), ``step`` and
    ``preprocess`` (their durations). The loader is the time from one iteration's end to
    the next one's start; the hooks are what the iteration spent outside the step."""
    parts = {name: [] for name in (*PARTS, 'total')}
    for before, now in zip(stamps, stamps[1:]):
        values = dict(loader=now['start'] - before['end'], preprocess=now['preprocess'],
                      step=now['step'] - now['preprocess'],
                      hooks=now['end'] - now['start'] - now['step'],
                      total=now['end'] - before['end'])
        for name, value in values.items():
            parts[name].append(value)
    return parts


def run_one(spec: dict) -> dict:
    """Train ``spec['variant']`` of the recipe module ``spec['recipe']`` (in this process,
    with one torch thread) and time its iterations."""
    torch.set_num_threads(1)
    recipe = importlib.import_module(spec['recipe'])
    iters, warmup, batch = spec['iters'], spec['warmup'], spec['batch_size']
    schedule = dict(epochs=1, batch_size=batch)
    work_dir = tempfile.mkdtemp(prefix='recipe_speed_')
    cfg = recipe.pretrain_config(recipe.VIT_CONFIG, spec['variant'], 0, schedule,
                                 spec['data_root'], work_dir, probe=False)
    # One epoch of exactly the iterations needed, plus one to count FLOPs on.
    cfg.train_dataloader.dataset.indices = list(range(batch * (warmup + iters + 1)))
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.default_hooks.checkpoint = None
    runner = Runner.from_cfg(cfg)

    stamps: List[Dict[str, float]] = []
    flops: Dict[str, float] = {}
    model = runner.model
    train_step, preprocess = model.train_step, model.data_preprocessor.forward

    def timed_preprocess(*args, **kwargs):
        start = time.perf_counter()
        out = preprocess(*args, **kwargs)
        stamps[-1]['preprocess'] += time.perf_counter() - start
        return out

    def timed_step(data, optim_wrapper):
        if len(stamps) == warmup + iters + 1:
            # The last iteration is counted, not timed: mmengine's train_step with the
            # counter around the model alone (the views' resampling is not the model's).
            data = model.data_preprocessor(data, True)
            with FlopCounterMode(display=False) as counter:
                losses = model._run_forward(data, mode='loss')
                loss, log_vars = model.parse_losses(losses)
                optim_wrapper.update_params(loss)
            flops['per_image'] = counter.get_total_flops() / batch
            return log_vars
        start = time.perf_counter()
        out = train_step(data, optim_wrapper)
        stamps[-1]['step'] = time.perf_counter() - start
        return out

    model.train_step, model.data_preprocessor.forward = timed_step, timed_preprocess

    class First(Hook):
        priority = 0       # HIGHEST: before every other hook

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            stamps.append(dict(start=time.perf_counter(), preprocess=0.0))

    class Last(Hook):
        priority = 100     # LOWEST: after every other hook

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            stamps[-1]['end'] = time.perf_counter()

    runner.register_hook(First())
    runner.register_hook(Last())
    peak_before = bench.matmul_peak_gflops()
    runner.train()
    peak = statistics.mean([peak_before, bench.matmul_peak_gflops()])
    parts = split_iterations(stamps[warmup - 1:warmup + iters])
    medians = {name: statistics.median(values) for name, values in parts.items()}
    images_per_s = batch / medians['total']
    return dict(variant=spec['variant'], repo=spec['repo'], images_per_s=images_per_s,
                ms={name: 1000 * value for name, value in medians.items()},
                flop_per_image=flops['per_image'], peak_gflops=peak,
                mfu=flops['per_image'] * images_per_s / (peak * 1e9))


def time_checkouts(tool: str, codes: Dict[str, str], repeats: int, **spec) -> List[dict]:
    """Every variant of every checkout once per repetition, each in a fresh process of
    ``tool --child SPEC`` (``spec``: iters, warmup, batch_size, data_root), in an order that
    alternates between repetitions."""
    envs = {code: checkout_env(path) for code, path in codes.items()}
    runs = []
    plan = [(code, variant) for code in codes for variant in VARIANTS]
    for repeat in range(repeats):
        for code, variant in (plan if repeat % 2 == 0 else plan[::-1]):
            env, recipe = envs[code]
            child = dict(spec, repo=codes[code], variant=variant, recipe=recipe)
            run = bench.child_json([sys.executable, tool, '--child', json.dumps(child)],
                                   f'The {code} {variant} run failed', env=env, cwd=codes[code])
            runs.append(dict(run, code=code, repeat=repeat))
            print(f"repeat {repeat + 1}/{repeats} {code:8s} {variant:16s} "
                  f"{run['images_per_s']:6.1f} img/s  MFU {run['mfu']:.3f}", flush=True)
    return runs


def summarise(runs: List[dict], codes: List[str]) -> dict:
    """Per code and variant: images/s, parts and MFU over the repetitions; per repetition
    ratios (this code / baseline per variant, MST / DINO per code), then their spread."""
    by = {(r['code'], r['variant'], r['repeat']): r for r in runs}
    repeats = sorted({r['repeat'] for r in runs})

    def ratio(key: str, numerator: tuple, denominator: tuple) -> dict:
        return bench.spread([by[(*numerator, i)][key] / by[(*denominator, i)][key]
                             for i in repeats])

    rows = {}
    for code in codes:
        for variant in VARIANTS:
            mine = [by[code, variant, i] for i in repeats]
            rows[f'{code}/{variant}'] = dict(
                images_per_s=bench.spread([r['images_per_s'] for r in mine]),
                ms={part: bench.spread([r['ms'][part] for r in mine])
                    for part in (*PARTS, 'total')},
                mfu=bench.spread([r['mfu'] for r in mine]),
                flop_per_image=mine[0]['flop_per_image'],
                peak_gflops=bench.spread([r['peak_gflops'] for r in mine]))
    ratios = {}
    for code in codes:
        for key, name in (('images_per_s', 'images/s'), ('mfu', 'MFU')):
            ratios[f'{code}: mst / dino {name}'] = ratio(
                key, (code, 'mst_guided_mask'), (code, 'dino'))
    if 'baseline' in codes:
        for variant in VARIANTS:
            ratios[f'{variant}: this / baseline images/s'] = ratio(
                'images_per_s', ('this', variant), ('baseline', variant))
    return dict(rows=rows, ratios=ratios)


def doc_rows(result: dict, run: str) -> List[str]:
    """The rows of docs/benchmarks.md for one run: one per code and variant, then one of
    ratios (``projects/mst_research/tests/test_benchmark_recipe.py`` checks the doc against the
    committed JSONs)."""
    rows = []
    for name, row in result['rows'].items():
        parts = ' | '.join(bench.median_range(row['ms'][part], 1) for part in PARTS)
        rows.append(f"| {run} | {name} | {bench.median_range(row['images_per_s'], 1)} "
                    f"| {parts} | {row['flop_per_image'] / 1e9:.3f} "
                    f"| {bench.median_range(row['mfu'])} |")
    ratios = result['ratios']
    speedups = ' | '.join(bench.median_range(ratios[f'{v}: this / baseline images/s'])
                          for v in VARIANTS if f'{v}: this / baseline images/s' in ratios)
    mfu = bench.median_range(ratios['this: mst / dino MFU'])
    if 'baseline: mst / dino MFU' in ratios:
        mfu += f" ({bench.median_range(ratios['baseline: mst / dino MFU'])})"
    load = result['load_per_core']['before']
    rows.append(f"| {run} | {speedups} | {mfu} | "
                f"{'-' if load is None else f'{load:.2f}'} |")
    return rows


def print_summary(result: dict) -> None:
    """The docs' tables of a run, and every ratio."""
    print('| run | code / variant | images/s | loader ms | preprocess ms | step ms | hooks ms | '
          'GFLOP / image | MFU |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    print('\n'.join(doc_rows(result, '-')[:-1]))
    print()
    for name, value in result['ratios'].items():
        print(f'{name}: {bench.median_range(value)}')
    print('\ndocs/benchmarks.md rows (run RUN):')
    print('\n'.join(doc_rows(result, 'RUN')))
