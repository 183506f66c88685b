"""tools/train.py's dataloader flags reach every dataloader of the config."""
import os
import sys

import pytest
import torch
from mmengine.config import Config

from tests.helpers import REPO, load_tool

DEIT_S = str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')


def deit_s_config() -> Config:
    cfg = Config.fromfile(DEIT_S)
    assert cfg.train_dataloader.pin_memory is True and cfg.train_dataloader.num_workers > 0
    cfg.train_dataloader.persistent_workers = True
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


@pytest.mark.skipif(torch.cuda.is_available(), reason='on a GPU it runs the whole GPU check')
def test_check_gpu_sh_on_a_machine_without_cuda_says_so_and_exits_cleanly(tmp_path):
    import subprocess
    report = tmp_path / 'report.md'
    result = subprocess.run(['bash', str(REPO / 'tools' / 'check_gpu.sh'), str(report)],
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 0, result.stderr
    assert 'no CUDA device' in result.stdout and not report.exists()
