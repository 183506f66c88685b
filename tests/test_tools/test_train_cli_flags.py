"""tools/train.py's dataloader flags reach every dataloader of the config."""

import pytest
from mmengine.config import Config

from tests.helpers import REPO, load_tool

DEIT_S = str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')


def deit_s_config() -> Config:
    cfg = Config.fromfile(DEIT_S)
    assert cfg.train_dataloader.pin_memory is True and cfg.train_dataloader.num_workers > 0
    assert cfg.train_dataloader.persistent_workers is True  # mmpretrain's recipes' value
    return cfg


def test_no_pin_memory_and_no_persistent_workers_reach_the_dataloaders():
    train = load_tool('tools/train.py')
    args = train.parse_args([DEIT_S, '--no-pin-memory', '--no-persistent-workers'])
    merged = train.merge_args(deit_s_config(), args)
    assert merged.train_dataloader.pin_memory is False
    assert merged.train_dataloader.persistent_workers is False


def test_without_the_flags_the_config_keeps_its_values():
    train = load_tool('tools/train.py')
    merged = train.merge_args(deit_s_config(), train.parse_args([DEIT_S]))
    assert merged.train_dataloader.pin_memory is True
    assert merged.train_dataloader.persistent_workers is True


def test_auto_scale_lr_on_16_gpus_doubles_every_group_of_the_recipe_lr(tmp_path):
    """The README's 16-GPU Slurm example: `--auto-scale-lr` scales DINO's 5e-4 x 1024 / 256
    by 16 x 128 / 1024 in every parameter group, through mmengine's Runner.scale_lr."""
    from mst_mm.engine import build_runner
    train = load_tool('tools/train.py')
    cfg = train.merge_args(Config.fromfile(DEIT_S), train.parse_args([DEIT_S, '--auto-scale-lr']))
    assert cfg.auto_scale_lr == dict(base_batch_size=1024, enable=True)
    cfg.work_dir = str(tmp_path)
    runner = build_runner(cfg)
    runner._world_size = 16  # what 16 ranks of 128 images would see
    wrapper = runner.build_optim_wrapper(cfg.optim_wrapper)
    before = [group['lr'] for group in wrapper.optimizer.param_groups]
    runner.scale_lr(wrapper, cfg.auto_scale_lr)
    after = [group['lr'] for group in wrapper.optimizer.param_groups]
    assert before and set(before) == {5e-4 * 1024 / 256}
    assert after == pytest.approx([2 * lr for lr in before], rel=1e-12)
