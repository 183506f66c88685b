"""End-to-end speed of the evidence recipe's pretraining, this code against a baseline.

Each measurement is one fresh process that trains the recipe of
``configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py`` (through ``tools/evidence.py``'s
``pretrain_config``, as the evidence run does) on one core: one torch thread, no data
workers, batches of 64, mmengine's Runner with every hook and the logging. It times
``--iters`` iterations after ``--warmup`` untimed ones and splits each into

- ``loader``: fetching the batch (file reading, decoding and, per image, whatever the
  dataset pipeline does),
- ``preprocess``: the model's data preprocessor (with ``BatchMultiCrop``: the views),
- ``step``: the rest of ``train_step`` (forward, backward, optimiser, EMA),
- ``hooks``: everything else in the iteration (hooks, logging).

MFU is the FLOP per image of one ``train_step`` (torch's FLOP counter: the matrix products
and convolutions of forward and backward) times images/s, over a float32 matrix-product
peak measured in the same process (1024 x 1024, one thread). MST does more operations per
image than DINO (its decoder), so compare the two by MFU, not by time.

The processes of the two code versions (``--baseline``, a checkout of another commit, e.g.
a ``git worktree``) and the two variants (DINO, MST-guided) are interleaved in every
repetition, in an order that alternates, and each ratio is taken within a repetition:
its median and range over the repetitions are the figure and its spread.

    git worktree add /tmp/mst_baseline 0e60de1
    python tools/analysis/benchmark_recipe.py --baseline /tmp/mst_baseline --repeats 5
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
VARIANTS = ('dino', 'mst_guided_mask')
PARTS = ('loader', 'preprocess', 'step', 'hooks')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--baseline', metavar='DIR',
                        help='a checkout of the code to compare with (its tools/evidence.py '
                        'and configs are used); without it only this code is measured')
    parser.add_argument('--repeats', type=int, default=5, help='interleaved repetitions')
    parser.add_argument('--iters', type=int, default=30, help='timed iterations per process')
    parser.add_argument('--warmup', type=int, default=5, help='untimed iterations first')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--data-root', default=osp.join(REPO, 'data', 'animal_shapes'),
                        help='objects/ as tools/misc/write_animal_shapes.py writes it')
    parser.add_argument('--out', default='work_dirs/benchmark/recipe.json')
    parser.add_argument('--child', help=argparse.SUPPRESS)  # internal: JSON spec of one run
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- one process
def matmul_peak_gflops(size: int = 1024, repeats: int = 15) -> float:
    """Float32 matrix-product rate of this process (its torch threads), median of runs."""
    import torch
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def split_iterations(stamps: List[Dict[str, float]]) -> Dict[str, List[float]]:
    """Per iteration, seconds of each part from the stamps the timing hooks took: ``start``
    (first hook before the iteration), ``end`` (last hook after it), ``step`` and
    ``preprocess`` (their durations). The loader is the time from one iteration's end to
    the next one's start; the hooks are what the iteration spent outside the step."""
    parts = {name: [] for name in (*PARTS, 'total')}
    for before, now in zip(stamps, stamps[1:]):
        total = now['end'] - before['end']
        loader = now['start'] - before['end']
        hooks = now['end'] - now['start'] - now['step']
        values = dict(loader=loader, preprocess=now['preprocess'],
                      step=now['step'] - now['preprocess'], hooks=hooks, total=total)
        for name, value in values.items():
            parts[name].append(value)
    return parts


def run_one(spec: dict) -> dict:
    """Train ``spec['variant']`` of ``spec['repo']``'s recipe and time its iterations."""
    sys.path[:0] = [spec['repo'], osp.join(spec['repo'], 'tools')]
    import torch
    torch.set_num_threads(1)
    import evidence  # the checkout's own tools/evidence.py
    from mmengine.hooks import Hook
    from mmengine.runner import Runner
    from torch.utils.flop_counter import FlopCounterMode

    iters, warmup, batch = spec['iters'], spec['warmup'], spec['batch_size']
    schedule = dict(epochs=1, batch_size=batch)
    work_dir = tempfile.mkdtemp(prefix='recipe_speed_')
    cfg = evidence.pretrain_config(evidence.VIT_CONFIG, spec['variant'], 0, schedule,
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
    peak_before = matmul_peak_gflops()
    runner.train()
    peak = statistics.mean([peak_before, matmul_peak_gflops()])
    parts = split_iterations(stamps[warmup - 1:warmup + iters])
    medians = {name: statistics.median(values) for name, values in parts.items()}
    images_per_s = batch / medians['total']
    return dict(variant=spec['variant'], repo=spec['repo'], images_per_s=images_per_s,
                ms={name: 1000 * value for name, value in medians.items()},
                flop_per_image=flops['per_image'], peak_gflops=peak,
                mfu=flops['per_image'] * images_per_s / (peak * 1e9))


# ----------------------------------------------------------------------------- the run
def spread(values: List[float]) -> dict:
    return dict(median=statistics.median(values), min=min(values), max=max(values))


def fmt(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def summarise(runs: List[dict], codes: List[str]) -> dict:
    """Per code and variant: images/s, parts and MFU over the repetitions; per repetition
    ratios (this code / baseline per variant, MST / DINO per code), then their spread."""
    by = {(r['code'], r['variant'], r['repeat']): r for r in runs}
    repeats = sorted({r['repeat'] for r in runs})
    rows = {}
    for code in codes:
        for variant in VARIANTS:
            mine = [by[code, variant, i] for i in repeats]
            rows[f'{code}/{variant}'] = dict(
                images_per_s=spread([r['images_per_s'] for r in mine]),
                ms={part: spread([r['ms'][part] for r in mine]) for part in (*PARTS, 'total')},
                mfu=spread([r['mfu'] for r in mine]),
                flop_per_image=mine[0]['flop_per_image'],
                peak_gflops=spread([r['peak_gflops'] for r in mine]))
    ratios = {}
    for code in codes:
        ratios[f'{code}: mst / dino images/s'] = spread(
            [by[code, 'mst_guided_mask', i]['images_per_s'] / by[code, 'dino', i]['images_per_s']
             for i in repeats])
        ratios[f'{code}: mst / dino MFU'] = spread(
            [by[code, 'mst_guided_mask', i]['mfu'] / by[code, 'dino', i]['mfu']
             for i in repeats])
    if 'baseline' in codes:
        for variant in VARIANTS:
            ratios[f'{variant}: this / baseline images/s'] = spread(
                [by['this', variant, i]['images_per_s'] / by['baseline', variant, i]['images_per_s']
                 for i in repeats])
    return dict(rows=rows, ratios=ratios)


def doc_rows(result: dict, run: str) -> List[str]:
    """The rows of docs/benchmarks.md for one run: one per code and variant, then one of
    ratios (``tests/test_benchmark_recipe.py`` checks the doc against the committed JSONs)."""
    rows = []
    for name, row in result['rows'].items():
        parts = ' | '.join(fmt(row['ms'][part], 1) for part in PARTS)
        rows.append(f"| {run} | {name} | {fmt(row['images_per_s'], 1)} | {parts} | "
                    f"{row['flop_per_image'] / 1e9:.3f} | {fmt(row['mfu'], 3)} |")
    ratios = result['ratios']
    speedups = ' | '.join(fmt(ratios[f'{v}: this / baseline images/s'], 3)
                          for v in VARIANTS if f'{v}: this / baseline images/s' in ratios)
    mfu = fmt(ratios['this: mst / dino MFU'], 3)
    if 'baseline: mst / dino MFU' in ratios:
        mfu += f" ({fmt(ratios['baseline: mst / dino MFU'], 3)})"
    load = result['load_per_core']['before']
    rows.append(f"| {run} | {speedups} | {mfu} | "
                f"{'-' if load is None else f'{load:.2f}'} |")
    return rows


def print_summary(result: dict) -> None:
    print('| run | code / variant | images/s | loader ms | preprocess ms | step ms | hooks ms | '
          'GFLOP / image | MFU |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    print('\n'.join(doc_rows(result, '-')[:-1]))
    print()
    for name, value in result['ratios'].items():
        print(f'{name}: {fmt(value, 3)}')
    print('\ndocs/benchmarks.md rows (run RUN):')
    print('\n'.join(doc_rows(result, 'RUN')))


def load_per_core() -> Optional[float]:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return None


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return {}
    if not osp.isdir(osp.join(args.data_root, 'objects')):
        raise SystemExit(f'{args.data_root}/objects is missing: write the images first with '
                         f'python tools/misc/write_animal_shapes.py {args.data_root}')
    codes = {'this': REPO}
    if args.baseline:
        if not osp.isfile(osp.join(args.baseline, 'tools', 'evidence.py')):
            raise SystemExit(f'--baseline {args.baseline} is not a checkout of this project '
                             '(no tools/evidence.py): make one with git worktree add DIR COMMIT')
        codes = {'baseline': osp.abspath(args.baseline), **codes}
    load_before = load_per_core()
    runs = []
    plan = [(code, variant) for code in codes for variant in VARIANTS]
    for repeat in range(args.repeats):
        for code, variant in (plan if repeat % 2 == 0 else plan[::-1]):
            spec = dict(repo=codes[code], variant=variant, iters=args.iters,
                        warmup=args.warmup, batch_size=args.batch_size,
                        data_root=osp.abspath(args.data_root))
            env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
            done = subprocess.run([sys.executable, osp.abspath(__file__), '--child',
                                   json.dumps(spec)], env=env, cwd=codes[code],
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f'The {code} {variant} run failed:\n{done.stderr[-3000:]}')
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append(dict(run, code=code, repeat=repeat))
            print(f"repeat {repeat + 1}/{args.repeats} {code:8s} {variant:16s} "
                  f"{run['images_per_s']:6.1f} img/s  MFU {run['mfu']:.3f}", flush=True)
    summary = summarise(runs, list(codes))
    result = dict(summary, runs=runs, args=vars(args), codes=codes,
                  commits={code: git_commit(path) for code, path in codes.items()},
                  load_per_core=dict(before=load_before, after=load_per_core()))
    print()
    print_summary(result)
    print(f"\nload average per core: {result['load_per_core']['before']} before, "
          f"{result['load_per_core']['after']} after")
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=2)
    print(f'written: {args.out}')
    return result


def git_commit(path: str) -> Optional[str]:
    """The checkout's short commit, with ``+dirty`` when tracked files were changed."""
    done = subprocess.run(['git', '-C', path, 'rev-parse', '--short', 'HEAD'],
                          capture_output=True, text=True)
    changed = subprocess.run(['git', '-C', path, 'status', '--porcelain', '--untracked-files=no'],
                             capture_output=True, text=True).stdout.strip()
    commit = done.stdout.strip()
    return (commit + ('+dirty' if changed else '')) or None


if __name__ == '__main__':
    main()
