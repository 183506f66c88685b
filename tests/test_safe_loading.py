"""Weights-only loading reads mmengine checkpoints, refuses code in a pickle, names a broken
file, and allows mmengine's globals for its own loads only."""
import os
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner import CheckpointLoader

from mst_mm.compat import HAS_SAFE_GLOBALS, get_safe_globals
from mst_mm.engine import build_runner, read_checkpoint, safe_loading
from mst_mm.engine.safe_loading import _history_buffer_method, unsafe_global
from mst_mm.errors import CheckpointError
from tests.helpers import make_image_folder, tiny_runner_cfg


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def training_checkpoint(path) -> str:
    """What mmengine's runner saves: numpy scalars and arrays, a message hub of
    HistoryBuffers (whose statistics methods pickle as getattr)."""
    hub = MessageHub.get_instance('safe_loading_test')
    hub.update_scalar('train/loss', np.float64(1.5))
    hub.update_scalar('train/loss', 2.5)
    torch.save(dict(meta=dict(epoch=1, seed=np.int64(7), hist=np.arange(3)),
                    message_hub=hub.state_dict(), state_dict={'w': torch.ones(2)}), path)
    return str(path)


@pytest.fixture(params=['safe_globals', 'restricted_unpickler'])
def loader(request, monkeypatch):
    """Each test below runs with both ways of loading: torch's weights-only unpickler with
    the allow-list added for the call (torch >= 2.5), and the restricted unpickler that
    older torch gets (forced here on a newer torch too)."""
    if request.param == 'safe_globals' and not HAS_SAFE_GLOBALS:
        pytest.skip(f'torch {torch.__version__} has no safe_globals')
    monkeypatch.setattr(safe_loading, 'HAS_SAFE_GLOBALS', request.param == 'safe_globals')
    return request.param


def test_an_mmengine_checkpoint_loads_and_its_globals_stay_refused_elsewhere(tmp_path, loader):
    path = training_checkpoint(tmp_path / 'epoch_1.pth')
    before = set(map(str, get_safe_globals()))
    loaded = read_checkpoint(path)
    assert loaded['meta']['seed'] == 7 and loaded['meta']['hist'].tolist() == [0, 1, 2]
    buffer = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer) and buffer.mean() == 2.0   # (1.5 + 2.5) / 2
    # Nothing was allowed for the process: a plain weights-only load still refuses the file.
    assert set(map(str, get_safe_globals())) == before
    with pytest.raises(pickle.UnpicklingError, match='numpy|HistoryBuffer|getattr'):
        torch.load(path, weights_only=True)
    torch.save({'buffer': HistoryBuffer()}, tmp_path / 'buffer.pth')
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
        torch.load(tmp_path / 'buffer.pth', weights_only=True)


@pytest.mark.parametrize('save', [dict(), dict(pickle_protocol=4),
                                  dict(_use_new_zipfile_serialization=False)],
                         ids=['zip', 'protocol 4', 'legacy format'])
def test_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, loader, save):
    marker = tmp_path / 'executed'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'payload': RunsCode(marker)}, path, **save)
    message = (f'Refusing to load {path}: it names the global posix.system, which no '
               'checkpoint of ours holds. It could run code hidden in the file')
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(str(path), map_location='cpu')
    assert unsafe_global(str(path)) == 'posix.system'
    assert unsafe_global(training_checkpoint(tmp_path / 'fine.pth')) is None
    # mmengine's own loader is left as it was: where torch loads weights-only by default
    # (2.6 and later) it refuses too; older torch would run the payload through it.
    if hasattr(torch.serialization, '_default_to_weights_only'):
        with pytest.raises(pickle.UnpicklingError):
            CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    assert not marker.exists()


@pytest.mark.parametrize('resume', [False, True], ids=['load_from', 'resume'])
def test_runner_refuses_an_unsafe_load_from_or_resume(tmp_path, resume, loader):
    marker, path = tmp_path / 'executed', tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': {}, 'payload': RunsCode(marker)}, path)
    data_root = make_image_folder(tmp_path / 'data', classes=1, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp_path / 'work')
    cfg.load_from, cfg.resume = str(path), resume
    runner = build_runner(cfg)  # the configs' runner_type, CheckedRunner
    with pytest.raises(CheckpointError, match=f'Refusing to load {path}'):
        runner.load_or_resume()
    assert not marker.exists()


def test_a_missing_empty_truncated_or_foreign_file_is_named_with_what_is_wrong(tmp_path, loader):
    with pytest.raises(CheckpointError, match=f'Checkpoint {tmp_path}/none.pth does not exist'):
        read_checkpoint(str(tmp_path / 'none.pth'))
    training_checkpoint(tmp_path / 'full.pth')
    data = (tmp_path / 'full.pth').read_bytes()
    for name, content, why in [
            ('empty.pth', b'', 'the file is empty (0 bytes)'),
            ('cut.pth', data[:len(data) // 2],
             f'the file is truncated ({len(data) // 2} bytes, the end of its zip archive'),
            ('notes.pth', b'these are notes\n', 'it is not a PyTorch checkpoint')]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError) as error:
            read_checkpoint(str(tmp_path / name), mmap=True)
        assert str(error.value).startswith(f'Cannot read checkpoint {tmp_path / name}: {why}')


def test_only_history_buffer_methods_pass_the_getattr_stand_in():
    assert _history_buffer_method(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(RuntimeError, match='Refusing'):
        _history_buffer_method(os, 'system')
    with pytest.raises(RuntimeError, match='Refusing'):
        _history_buffer_method(HistoryBuffer, '__init__')


def test_a_url_is_downloaded_once_into_torch_hub_and_read_weights_only(tmp_path, loader,
                                                                       monkeypatch):
    """mmengine loads ``http(s)://`` checkpoints through torch.hub with pickle's full powers;
    ours downloads the file into the hub cache and reads it as a local file."""
    served = {'good.pth': training_checkpoint(tmp_path / 'good.pth'),
              'evil.pth': str(tmp_path / 'evil.pth')}
    marker = tmp_path / 'executed'
    torch.save({'state_dict': {}, 'payload': RunsCode(marker)}, served['evil.pth'])
    downloads = []

    def fake_download(url, dst, *args, **kwargs):
        downloads.append(url)
        with open(served[os.path.basename(url)], 'rb') as src, open(dst, 'wb') as out:
            out.write(src.read())

    monkeypatch.setattr(torch.hub, 'download_url_to_file', fake_download)
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    url = 'https://example.org/weights/good.pth'
    for _ in range(2):
        assert torch.equal(read_checkpoint(url)['state_dict']['w'], torch.ones(2))
    assert downloads == [url]
    assert (tmp_path / 'hub' / 'checkpoints' / 'good.pth').is_file()
    evil = tmp_path / 'hub' / 'checkpoints' / 'evil.pth'
    with pytest.raises(CheckpointError, match=f'Refusing to load {evil}: it names the global'):
        read_checkpoint('http://example.org/evil.pth')
    assert not marker.exists()
    with pytest.raises(CheckpointError, match='Download it and give the local path'):
        read_checkpoint('open-mmlab://resnet50_caffe')
