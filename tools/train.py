# Copyright (c) mst_mm contributors. Follows mmpretrain's tools/train.py.
"""Train a model from a config of this repository (pretraining or downstream).

Examples::

    python tools/train.py configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py
    python tools/train.py CONFIG --amp --work-dir work_dirs/run1
    python tools/train.py CONFIG --resume               # newest checkpoint in work_dir
    python tools/train.py CONFIG --resume path/to/epoch_10.pth

``--resume`` alone continues from what WORK_DIR/last_checkpoint names (mmengine's
auto-resume): the rolling ``latest.pth`` (written at every epoch end by the configs'
SafeCheckpointHook) or a kept ``epoch_N.pth``, whichever is newer, so a killed run loses at
most one epoch.

A bad input (a ``--cfg-options`` entry, a checkpoint that cannot be resumed) ends the run
before training with one message that names it and the fix, and exit status 2.
"""
import argparse
import os
import os.path as osp

from mmengine.config import Config
from mmengine.utils import digit_version
from mmengine.utils.dl_utils import TORCH_VERSION

from mst_mm.engine.checked_runner import check_training_checkpoint
from mst_mm.utils.cli import add_cfg_options_argument, merge_cfg_options, run_tool


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from this training checkpoint; without a path, from the newest one '
        'in the work dir (the rolling latest.pth or epoch_N.pth, as last_checkpoint names)')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='enable automatic-mixed-precision training')
    parser.add_argument(
        '--no-validate',
        action='store_true',
        help='whether not to evaluate the checkpoint during training')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='whether to auto scale the learning rate according to the '
        'actual batch size and the original batch size.')
    parser.add_argument(
        '--no-pin-memory',
        action='store_true',
        help='whether to disable the pin_memory option in dataloaders.')
    parser.add_argument(
        '--no-persistent-workers',
        action='store_true',
        help='whether to disable the persistent_workers option in '
        'dataloaders.')
    add_cfg_options_argument(parser)
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    # torchrun passes `--local-rank`, torch.distributed.launch `--local_rank`.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def merge_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Merge command-line arguments into the config, as mmpretrain does."""
    if args.no_validate:
        cfg.val_cfg = None
        cfg.val_dataloader = None
        cfg.val_evaluator = None

    cfg.launcher = args.launcher

    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])

    if args.amp is True:
        from mst_mm.engine.optimizers import AMP_OPTIM_WRAPPERS
        optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if optim_wrapper not in AMP_OPTIM_WRAPPERS:
            raise ValueError(f'--amp has no mixed-precision counterpart of optim_wrapper type '
                             f'{optim_wrapper!r}; use one of {sorted(AMP_OPTIM_WRAPPERS)}.')
        cfg.optim_wrapper.type = AMP_OPTIM_WRAPPERS[optim_wrapper]
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')

    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume

    if args.auto_scale_lr:
        cfg.auto_scale_lr.enable = True

    def set_default_dataloader_cfg(cfg, field):
        if cfg.get(field, None) is None:
            return
        dataloader_cfg = cfg[field]
        dataloader_cfg.setdefault('persistent_workers', True)
        dataloader_cfg.setdefault('collate_fn', dict(type='default_collate'))

    # mmpretrain's defaults, for mmpretrain's configs only: mmdet and mmseg batch images of
    # different sizes, which default_collate cannot stack (their train.py sets nothing).
    if cfg.get('default_scope', 'mmpretrain') == 'mmpretrain':
        set_default_dataloader_cfg(cfg, 'train_dataloader')
        set_default_dataloader_cfg(cfg, 'val_dataloader')
        set_default_dataloader_cfg(cfg, 'test_dataloader')

    merge_cfg_options(cfg, args.cfg_options)
    for field in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(field, None)
        if loader is None:
            continue
        if args.no_pin_memory:
            loader['pin_memory'] = False
        # Persistent workers need workers.
        if args.no_persistent_workers or loader.get('num_workers', 0) == 0:
            loader['persistent_workers'] = False  # also after --cfg-options num_workers=0
    return cfg


def resolve_resume(cfg: Config) -> Config:
    """Check that ``--resume PATH`` is a training checkpoint, before anything is built
    (``--resume`` alone is mmengine's auto-resume)."""
    if cfg.get('resume', False) and cfg.get('load_from'):
        check_training_checkpoint(cfg.load_from)
    return cfg


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    cfg = resolve_resume(merge_args(cfg, args))

    # torch.compile needs torch >= 2.0, as in mmpretrain.
    if cfg.get('compile') and digit_version(TORCH_VERSION) < digit_version('2.0.0'):
        raise RuntimeError('`compile` in the config requires torch >= 2.0')

    from mst_mm.engine import build_runner, init_cpu_distributed  # registers mst_mm too
    init_cpu_distributed(args.launcher)
    runner = build_runner(cfg)
    runner.train()


if __name__ == '__main__':
    run_tool(main)
