"""Weights-only loading reads mmengine checkpoints and still refuses code in a pickle."""
import os

import pytest
import torch
from mmengine.runner import CheckpointLoader

import mst_mm  # noqa: F401  (registers the allow-list)
from mst_mm.engine.safe_loading import _history_buffer_method


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def test_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / 'executed'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'payload': RunsCode(marker)}, path)
    with pytest.raises(Exception, match='Weights only load failed'):
        CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    assert not marker.exists()


def test_only_history_buffer_methods_pass_the_getattr_stand_in():
    from mmengine.logging import HistoryBuffer

    assert _history_buffer_method(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(RuntimeError, match='Refusing'):
        _history_buffer_method(os, 'system')
    with pytest.raises(RuntimeError, match='Refusing'):
        _history_buffer_method(HistoryBuffer, '__init__')
