"""End-to-end speed of the evidence recipe's pretraining, this code against a baseline.

    git worktree add /tmp/mst_baseline 0e60de1
    python projects/mst_research/tools/benchmark_recipe.py --baseline /tmp/mst_baseline --repeats 5

Every run is a fresh process of this tool (``--child``) that trains one variant of one
checkout's recipe on one core: ``mst_research.recipe_speed`` says how an iteration is split
and timed, docs/benchmarks.md what every figure means.
"""
import argparse
import json
import os.path as osp
from typing import List, Optional

from mst_research import bench
from mst_research.recipe_speed import print_summary, run_one, summarise, time_checkouts


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--baseline', metavar='DIR',
                        help='a checkout of the code to compare with (its recipe and configs '
                        'are used); without it only this code is measured')
    parser.add_argument('--repeats', type=int, default=5, help='interleaved repetitions')
    parser.add_argument('--iters', type=int, default=30, help='timed iterations per process')
    parser.add_argument('--warmup', type=int, default=5, help='untimed iterations first')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--data-root', default=osp.join(bench.REPO, 'data', 'animal_shapes'),
                        help='objects/ as write_animal_shapes.py writes it')
    parser.add_argument('--out', default='work_dirs/benchmark/recipe.json')
    parser.add_argument('--child', help=argparse.SUPPRESS)  # internal: JSON spec of one run
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return {}
    if not osp.isdir(osp.join(args.data_root, 'objects')):
        raise SystemExit(f'{args.data_root}/objects is missing: write the images first with '
                         'python projects/mst_research/tools/write_animal_shapes.py '
                         f'{args.data_root}')
    codes = {'this': bench.REPO}
    if args.baseline:
        codes = {'baseline': osp.abspath(args.baseline), **codes}
    load_before = bench.load_per_core()
    runs = time_checkouts(osp.abspath(__file__), codes, args.repeats, iters=args.iters,
                          warmup=args.warmup, batch_size=args.batch_size,
                          data_root=osp.abspath(args.data_root))
    result = dict(summarise(runs, list(codes)), runs=runs, args=vars(args), codes=codes,
                  commits={code: bench.git_commit(path) for code, path in codes.items()},
                  load_per_core=dict(before=load_before, after=bench.load_per_core()))
    print()
    print_summary(result)
    print(f"\nload average per core: {result['load_per_core']['before']} before, "
          f"{result['load_per_core']['after']} after")
    bench.write_json(args.out, result)
    print(f'written: {args.out}')
    return result


if __name__ == '__main__':
    main()
