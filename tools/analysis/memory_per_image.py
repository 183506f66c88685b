"""What one training step of a pretraining config holds in memory, per image and in all.

    python tools/analysis/memory_per_image.py configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py
    python tools/analysis/memory_per_image.py CONFIG --batch-sizes 32 64 --device cuda

Each batch size runs in a fresh process: the model and its optimiser are built and two
training steps run (the data preprocessor's views, forward, backward, update). The figure is
the process's peak: on a CPU its peak resident memory (``VmHWM``), on a GPU
``torch.cuda.max_memory_allocated``. Over two or more batch sizes, the slope of the peak is
the memory per image (the activations that the backward pass keeps) and the intercept what
does not grow with the batch (the model, its gradients, the optimiser's state and, on a CPU,
the libraries). On a CPU the step runs in float32; a GPU run in mixed precision keeps many
activations in 16 bits.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

CHILD_FLAG = '--one-batch-size'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='a pretraining config whose pipeline has MultiCrop')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[2, 4],
                        help='images per step; two or more give the memory per image')
    parser.add_argument('--device', default='cpu', help='cpu or cuda')
    parser.add_argument('--out', default=None, help='JSON file of the figures')
    parser.add_argument(CHILD_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    return parser


def step_memory_mib(config: str, batch_size: int, device: str) -> Dict[str, float]:
    """This process's peak memory over two training steps of ``config`` (MiB)."""
    import torch
    from benchmark import build_for_training, synthetic_batch
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    model, optim_wrapper = build_for_training(cfg, device, amp=False)
    batch = synthetic_batch(cfg, batch_size, device=device)
    for _ in range(2):  # the second step also holds the optimiser's state
        model.train_step(batch, optim_wrapper)
    if device.startswith('cuda'):
        return dict(peak=torch.cuda.max_memory_allocated() / 2**20)
    return dict(peak=_peak_resident_mib())


def _peak_resident_mib() -> float:
    """This process's peak resident memory since its exec (``VmHWM``). ``ru_maxrss`` would
    start from the parent's at the fork (Linux keeps it across ``execve``)."""
    with open('/proc/self/status') as f:
        line = next(line for line in f if line.startswith('VmHWM:'))
    return int(line.split()[1]) / 1024  # kB


def fit(rows: List[dict]) -> Optional[Dict[str, float]]:
    """Least squares of the peak against the batch size: MiB per image and the fixed MiB."""
    if len(rows) < 2:
        return None
    xs = [r['batch_size'] for r in rows]
    ys = [r['peak'] for r in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
             / sum((x - mean_x)**2 for x in xs))
    return dict(mib_per_image=slope, fixed_mib=mean_y - slope * mean_x)


def main(argv: Optional[List[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    if getattr(args, CHILD_FLAG[2:].replace('-', '_')) is not None:
        result = step_memory_mib(args.config, args.one_batch_size, args.device)
        print(json.dumps(result))
        return result
    rows = []
    for batch_size in args.batch_sizes:
        child = subprocess.run([sys.executable, osp.abspath(__file__), args.config,
                                '--device', args.device, CHILD_FLAG, str(batch_size)],
                               capture_output=True, text=True)
        if child.returncode:
            raise SystemExit(f'batch {batch_size} failed:\n' + child.stderr[-2000:])
        rows.append(dict(batch_size=batch_size,
                         **json.loads(child.stdout.strip().splitlines()[-1])))
        print(f'batch {batch_size}: peak {rows[-1]["peak"]:.0f} MiB')
    results = dict(config=args.config, device=args.device, rows=rows, fit=fit(rows))
    if results['fit'] is not None:
        precision = 'float32' if args.device == 'cpu' else "the config's precision"
        print(f'{results["fit"]["mib_per_image"]:.0f} MiB per image and '
              f'{results["fit"]["fixed_mib"]:.0f} MiB fixed ({args.device}, {precision})')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == '__main__':
    main()
