"""Weighted k-NN top-1 of a checkpoint, as a table (and JSON).

    python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_vit-tiny_demo.py \
        CKPT [--weights student] [--ks 10 20] \
        [--out knn.json]
    # 8 GPUs (or CPU processes) share the feature extraction:
    torchrun --nproc_per_node 8 tools/analysis/knn_eval.py CONFIG CKPT --launcher pytorch
    srun -p PARTITION --ntasks 8 --gres gpu:8 python tools/analysis/knn_eval.py CONFIG CKPT \
        --launcher slurm

This is the one k-NN entry point: ``tools/test.py`` sends a k-NN config here.

CONFIG is a k-NN benchmark config (``configs/benchmarks/knn/``); CKPT an MST training
checkpoint (teacher weights by default) or any state dict the config's backbone accepts.
Checkpoints are loaded weights-only, and a checkpoint that does not provide every weight of
the backbone is refused, naming what is missing: the table would otherwise describe a
randomly initialised backbone. ``--allow-partial`` accepts one that provides only some.

With ``--launcher pytorch`` (or ``slurm``, ``mpi``) every process embeds its share of the
reference and query images (mmengine's distributed samplers), the features are gathered on
rank 0, which votes, prints the table and writes ``--out``; without a GPU the processes
talk through gloo.
"""
import argparse
import json
import os
import os.path as osp

from mmengine.config import Config
from mmengine.dist import is_main_process

# Importing mst_mm (through mst_mm.engine) registers its modules.
from mst_mm.engine import CheckedRunner, init_cpu_distributed
from mst_mm.errors import CheckpointError
from mst_mm.utils.cli import add_cfg_options_argument, merge_cfg_options, run_tool


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Weighted k-NN evaluation')
    parser.add_argument('config', help='k-NN benchmark config')
    parser.add_argument('checkpoint', help='checkpoint to evaluate')
    parser.add_argument('--weights', choices=['teacher', 'student'], default=None,
                        help='which backbone of an MST checkpoint (default: the config\'s)')
    parser.add_argument('--ks', type=int, nargs='+', help='k values (default: the config\'s)')
    parser.add_argument('--temperature', type=float, help='vote temperature T')
    parser.add_argument('--chunk-size', type=int, help='rows per similarity chunk')
    parser.add_argument('--work-dir', help='directory for logs')
    parser.add_argument('--out', metavar='FILE.json',
                        help='write the top-1 accuracies as a JSON file, {"top1_k10": ...}')
    parser.add_argument('--allow-partial', action='store_true',
                        help='accept a checkpoint that provides only some of the backbone\'s '
                        'weights (the rest stay randomly initialised; a warning lists them)')
    add_cfg_options_argument(parser)
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none',
                        help='job launcher: several processes share the feature extraction '
                        '(mmengine distributed; gloo without a GPU)')
    # torchrun passes `--local-rank`, torch.distributed.launch `--local_rank`.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.endswith('.json'):
        parser.error(f'--out is a JSON file (FILE.json), got {args.out!r}')
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise CheckpointError(f'Checkpoint {args.checkpoint} does not exist.')
    cfg = Config.fromfile(args.config)
    cfg.load_from = args.checkpoint
    cfg.launcher = args.launcher
    cfg.work_dir = args.work_dir or osp.join(
        'work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.weights:
        cfg.model.weights = args.weights
    for key, value in (('ks', args.ks), ('temperature', args.temperature),
                       ('chunk_size', args.chunk_size)):
        if value is not None:
            cfg.test_evaluator[key] = tuple(value) if key == 'ks' else value
    if args.allow_partial:
        cfg.allow_partial_load = True
    merge_cfg_options(cfg, args.cfg_options)

    init_cpu_distributed(args.launcher)
    metrics = CheckedRunner.from_cfg(cfg).test()
    # mmengine's evaluator hands every rank the metrics that rank 0 computed.
    rows = sorted((int(k.rsplit('_k', 1)[1]), v) for k, v in metrics.items() if '_k' in k)
    if not is_main_process():
        return {k: acc for k, acc in rows}
    print(f'\nweighted k-NN, {osp.basename(args.checkpoint)} '
          f'({cfg.model.get("weights", "-")} weights)')
    print('|   k | top-1 (%) |\n| --- | --- |')
    for k, acc in rows:
        print(f'| {k:3d} | {acc:9.2f} |')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({f'top1_k{k}': acc for k, acc in rows}, f, indent=2)
    return {k: acc for k, acc in rows}


if __name__ == '__main__':
    run_tool(main)
