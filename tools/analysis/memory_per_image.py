"""What one training step of a pretraining config holds in memory, per image and in all.

    python tools/analysis/memory_per_image.py configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py
    python tools/analysis/memory_per_image.py CONFIG --batch-sizes 32 64 --device cuda

Each batch size runs in a fresh process: the model and its optimiser are built, one training
step (the data preprocessor's views, forward, backward, update) warms up, and a second step is
measured. On a CPU the figure is the process's peak resident memory (``ru_maxrss``) less what
it held before the measured step; on a GPU ``torch.cuda.max_memory_allocated`` less the same.
The growth between two batch sizes, over their difference, is the memory per image (the
activations); the rest is what the model, the gradients and the optimiser's state hold. On a
CPU the step runs in float32; a GPU run in mixed precision keeps many activations in 16 bits.
"""
import argparse
import json
import os
import os.path as osp
import resource
import subprocess
import sys
from typing import Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

CHILD_FLAG = '--one-batch-size'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='a pretraining config')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[2, 4],
                        help='images per step; two or more give the memory per image')
    parser.add_argument('--device', default='cpu', help='cpu or cuda')
    parser.add_argument('--out', default=None, help='JSON file of the figures')
    parser.add_argument(CHILD_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    return parser


def step_memory_mib(config: str, batch_size: int, device: str) -> Dict[str, float]:
    """Peak memory of one training step, in this process, after a warm-up step (MiB)."""
    import torch
    from benchmark import build_for_training, synthetic_batch
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    model, optim_wrapper = build_for_training(cfg, device, amp=False)
    batch = synthetic_batch(cfg, batch_size, device=device)
    model.train_step(batch, optim_wrapper)  # the optimiser's state exists from here on
    if device.startswith('cuda'):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model.train_step(batch, optim_wrapper)
        torch.cuda.synchronize()
        return dict(held_before=before / 2**20,
                    step_growth=(torch.cuda.max_memory_allocated() - before) / 2**20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    current = _resident_mib()
    model.train_step(batch, optim_wrapper)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The warm-up step's own peak may stand above the current use: count from the larger.
    return dict(held_before=current, step_growth=max(peak - max(before, current), 0.0),
                peak=peak)


def _resident_mib() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def per_image(rows: List[dict]) -> Optional[float]:
    """The least-squares slope of the step's growth against the batch size (MiB per image)."""
    if len(rows) < 2:
        return None
    xs = [r['batch_size'] for r in rows]
    ys = [r['step_growth'] for r in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
            / sum((x - mean_x)**2 for x in xs))


def main(argv: Optional[List[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    if getattr(args, CHILD_FLAG[2:].replace('-', '_')) is not None:
        result = step_memory_mib(args.config, args.one_batch_size, args.device)
        print(json.dumps(result))
        return result
    rows = []
    for batch_size in args.batch_sizes:
        out = subprocess.run([sys.executable, osp.abspath(__file__), args.config,
                              '--device', args.device, CHILD_FLAG, str(batch_size)],
                             capture_output=True, text=True, check=True).stdout
        rows.append(dict(batch_size=batch_size, **json.loads(out.strip().splitlines()[-1])))
        print(f'batch {batch_size}: {rows[-1]["step_growth"]:.0f} MiB during the step, '
              f'{rows[-1]["held_before"]:.0f} MiB held before it')
    results = dict(config=args.config, device=args.device, rows=rows,
                   mib_per_image=per_image(rows))
    if results['mib_per_image'] is not None:
        precision = 'float32' if args.device == 'cpu' else "the config's precision"
        print(f'per image: {results["mib_per_image"]:.1f} MiB ({args.device}, {precision})')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == '__main__':
    main()
