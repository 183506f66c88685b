# Copyright (c) mst_mm contributors. Follows mmpretrain's tools/test.py.
"""Evaluate a checkpoint with the test loop of a config of this repository.

Example::

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl]

CONFIG is a config with a test split and a metric (a k-NN, linear-probe or downstream
config under ``configs/benchmarks/``). A pretraining config is refused with the commands
that evaluate its checkpoint instead (k-NN, linear probe, downstream transfer), with the
benchmark configs of the same backbone and width (the checkpoint's, read from it when the
file exists, else the config's).

The checkpoint must provide every weight of the config's model (``--allow-partial``
accepts one that provides only some); a bad input ends the run with one message and exit
status 2.
"""
import argparse
import os
import os.path as osp

from mmengine.config import Config

from mst_mm.engine import CheckedRunner  # (also registers mst_mm's modules)
from mst_mm.utils.cli import (
    add_cfg_options_argument,
    check_test_config,
    merge_cfg_options,
    run_tool,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test (and eval) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--work-dir',
        help='the directory to save the file containing evaluation metrics')
    parser.add_argument('--out', help='the file to output results.')
    parser.add_argument(
        '--out-item',
        choices=['metrics', 'pred'],
        help='To output whether metrics or predictions. '
        'Defaults to output predictions.')
    add_cfg_options_argument(parser)
    parser.add_argument(
        '--allow-partial', action='store_true',
        help='accept a checkpoint that provides only some of the model\'s weights (the '
        'rest stay randomly initialised; a warning lists them)')
    parser.add_argument(
        '--amp', action='store_true', help='enable automatic-mixed-precision test')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def merge_args(cfg: Config, args: argparse.Namespace) -> Config:
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.amp:
        cfg.test_cfg = cfg.get('test_cfg') or {}
        cfg.test_cfg.fp16 = True
    if args.out is not None and args.out_item in (None, 'pred'):
        cfg.test_evaluator = list(cfg.test_evaluator) if isinstance(
            cfg.test_evaluator, (list, tuple)) else [cfg.test_evaluator]
        cfg.test_evaluator.append(dict(type='DumpResults', out_file_path=args.out))
    if args.allow_partial:
        cfg.allow_partial_load = True
    merge_cfg_options(cfg, args.cfg_options)
    return cfg


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle', '.json')):
        raise ValueError('--out must be a .pkl, .pickle or .json file, '
                         f'got {args.out!r}')
    cfg = Config.fromfile(args.config)
    # A pretraining config has no test split: say what evaluates its checkpoint instead.
    check_test_config(cfg, args.config, args.checkpoint)
    cfg = merge_args(cfg, args)

    from mst_mm.engine import init_cpu_distributed
    init_cpu_distributed(args.launcher)
    runner = CheckedRunner.from_cfg(cfg)
    metrics = runner.test()
    if args.out and args.out_item == 'metrics':
        import mmengine
        mmengine.dump(metrics, args.out)


if __name__ == '__main__':
    run_tool(main)
