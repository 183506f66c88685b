"""Weights-only loading reads mmengine checkpoints and still refuses code in a pickle."""
import os
import pickle

import pytest
import torch
from mmengine.runner import CheckpointLoader

import mst_mm  # noqa: F401
from mst_mm.engine import build_runner, install_weights_only_loader, load_checkpoint_safely
from mst_mm.engine.safe_loading import _history_buffer_method
from tests.helpers import REPO, load_tool, make_image_folder, tiny_runner_cfg


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def test_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    marker = tmp_path / 'executed'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'payload': RunsCode(marker)}, path)
    with pytest.raises(pickle.UnpicklingError,
                       match=f'Refusing to load {path}: .*posix.system'):
        load_checkpoint_safely(str(path), map_location='cpu')
    # mmengine's own loader is left as it was (torch's weights-only default refuses too) ...
    with pytest.raises(pickle.UnpicklingError, match='posix.system'):
        CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    # ... until a user opts in to ours for the whole process.
    monkeypatch.setattr(CheckpointLoader, '_schemes', dict(CheckpointLoader._schemes))
    install_weights_only_loader()
    with pytest.raises(pickle.UnpicklingError, match=f'Refusing to load {path}'):
        CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    assert not marker.exists()


def _evil_checkpoint(tmp_path):
    marker = tmp_path / 'executed'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': {}, 'payload': RunsCode(marker)}, path)
    return path, marker


@pytest.mark.parametrize('resume', [False, True], ids=['load_from', 'resume'])
def test_runner_refuses_an_unsafe_load_from_or_resume(tmp_path, resume):
    path, marker = _evil_checkpoint(tmp_path)
    data_root = make_image_folder(tmp_path / 'data', classes=1, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp_path / 'work')
    cfg.load_from, cfg.resume = str(path), resume
    runner = build_runner(cfg)  # the configs' runner_type, CheckedRunner
    with pytest.raises(pickle.UnpicklingError, match=f'Refusing to load {path}'):
        runner.load_or_resume()
    assert not marker.exists()


def test_knn_tool_refuses_an_unsafe_checkpoint(tmp_path):
    path, marker = _evil_checkpoint(tmp_path)
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=2)
    tool = load_tool('tools/analysis/knn_eval.py')
    with pytest.raises(pickle.UnpicklingError, match=f'Refusing to load {path}'):
        tool.main([str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py'), str(path),
                   '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                   f'test_dataloader.dataset.data_root={data_root}',
                   f'test_cfg.train_dataloader.dataset.data_root={data_root}'])
    assert not marker.exists()


def test_only_history_buffer_methods_pass_the_getattr_stand_in():
    from mmengine.logging import HistoryBuffer

    assert _history_buffer_method(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(RuntimeError, match='Refusing'):
        _history_buffer_method(os, 'system')
    with pytest.raises(RuntimeError, match='Refusing'):
        _history_buffer_method(HistoryBuffer, '__init__')
