"""What one training step of a pretraining config holds in memory, per image and in all.

    python projects/mst_research/tools/memory_per_image.py \
        configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py
    python projects/mst_research/tools/memory_per_image.py CONFIG --batch-sizes 32 64 --device cuda

Each batch size runs two training steps in a fresh process (``--one-batch-size``); a straight
line through the peaks gives the memory per image (its slope) and what does not grow with
the batch (its intercept). docs/benchmarks.md explains the figures.
"""
import argparse
import json
import os.path as osp
import sys
from typing import List, Optional

from mst_research import bench
from mst_research.step_cost import fit_memory_per_image, step_memory_mib

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


def main(argv: Optional[List[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.one_batch_size is not None:
        result = step_memory_mib(args.config, args.one_batch_size, args.device)
        print(json.dumps(result))
        return result
    rows = []
    for batch_size in args.batch_sizes:
        rows.append(dict(batch_size=batch_size, **bench.child_json(
            [sys.executable, osp.abspath(__file__), args.config, '--device', args.device,
             CHILD_FLAG, str(batch_size)], f'batch {batch_size} failed')))
        print(f'batch {batch_size}: peak {rows[-1]["peak"]:.0f} MiB')
    results = dict(config=args.config, device=args.device, rows=rows,
                   fit=fit_memory_per_image(rows))
    if results['fit'] is not None:
        precision = 'float32' if args.device == 'cpu' else "the config's precision"
        print(f'{results["fit"]["mib_per_image"]:.0f} MiB per image and '
              f'{results["fit"]["fixed_mib"]:.0f} MiB fixed ({args.device}, {precision})')
    if args.out:
        bench.write_json(args.out, results, indent=1)
    return results


if __name__ == '__main__':
    main()
