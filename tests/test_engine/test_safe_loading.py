"""Checkpoint loading against a hostile file: an adversarial corpus, made here, one case per
attack class, each through every loader that exists (torch's weights-only loader, reached by
``read_checkpoint``, and the foreign-pickle reader, reached through it and called directly),
asserting which loader ran, that nothing ran or changed, and that genuine files still load."""
import io
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

from mst_mm.engine import build_runner, foreign_pickle, read_checkpoint, safe_loading
from mst_mm.engine.plain_checkpoint import TAG, from_plain, to_plain
from mst_mm.errors import CheckpointError
from tests.helpers import REPO, make_image_folder, tiny_runner_cfg

# -- a pickle assembler: the attacker's tool --------------------------------------------------


def text(s: str) -> bytes:
    data = s.encode()
    return pickle.BINUNICODE + struct.pack('<I', len(data)) + data


def integer(n: int) -> bytes:
    if -2**31 <= n < 2**31:
        return pickle.BININT + struct.pack('<i', n)
    data = n.to_bytes((n.bit_length() + 8) // 8, 'little', signed=True)
    return pickle.LONG1 + bytes([len(data)]) + data


def glob(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f'{module}\n{name}\n'.encode()


def call(func: bytes, *args: bytes) -> bytes:
    return func + pickle.MARK + b''.join(args) + pickle.TUPLE + pickle.REDUCE


def pickled(*body: bytes) -> bytes:
    return pickle.PROTO + b'\x02' + b''.join(body) + pickle.STOP


def torch_zip(path, data_pkl: bytes, records: dict = None, compress: bool = False) -> str:
    """A file laid out as torch.save lays it out, with ``data_pkl`` as its pickle."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, 'w', method) as archive:
        archive.writestr('archive/data.pkl', data_pkl)
        archive.writestr('archive/byteorder', 'little')
        archive.writestr('archive/version', '3\n')
        for name, data in (records or {}).items():
            archive.writestr(f'archive/data/{name}', data)
    return str(path)


def storage_tensor(key: str, numel: int, size: int, stride: int = 1, offset: int = 0) -> bytes:
    pid = (pickle.MARK + text('storage') + glob('torch', 'FloatStorage') + text(key)
           + text('cpu') + integer(numel) + pickle.TUPLE + pickle.BINPERSID)
    return call(glob('torch._utils', '_rebuild_tensor_v2'), pid, integer(offset),
                integer(size) + pickle.TUPLE1, integer(stride) + pickle.TUPLE1,
                pickle.NEWFALSE, call(glob('collections', 'OrderedDict')))


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


# -- which loader ran, and what must not change -----------------------------------------------


@pytest.fixture
def loaders(monkeypatch):
    """The names of the loaders that each read_checkpoint call ran, in order."""
    ran = []
    torch_load, foreign = torch.load, safe_loading.read_foreign_pickle

    def spy_torch(*args, **kwargs):
        ran.append('torch')
        assert kwargs.get('weights_only') is True and 'pickle_module' not in kwargs
        return torch_load(*args, **kwargs)

    def spy_foreign(*args, **kwargs):
        ran.append('foreign')
        return foreign(*args, **kwargs)

    monkeypatch.setattr(safe_loading.torch, 'load', spy_torch)
    monkeypatch.setattr(safe_loading, 'read_foreign_pickle', spy_foreign)
    return ran


def process_state() -> dict:
    """What an attack through a loader has changed in this process, when it did."""
    get_safe = getattr(torch.serialization, 'get_safe_globals', lambda: [])
    return dict(statistics=dict(HistoryBuffer._statistics_methods),
                safe_globals=sorted(map(str, get_safe())),
                dtype=np.dtype('f8').__reduce__(), cwd_files=sorted(os.listdir('.')))


def refused(path: str, loaders: list, expected_loaders: list, match: str) -> None:
    before = process_state()
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(path)
    assert loaders == expected_loaders
    assert process_state() == before


def foreign_read(path: str):
    """The foreign-pickle reader called directly, whatever torch's loader would say."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith('/data.pkl'))
        return foreign_pickle.read_foreign_pickle(archive, name, archive.read(name))


# -- the corpus: code execution -----------------------------------------------------------


def test_history_buffer_poisoning_runs_nothing_and_changes_no_class(tmp_path, loaders):
    """The attack on the old allow-list: unpickling a HistoryBuffer wrote ``__init__`` into the
    class-wide statistics table, a getattr stand-in handed it out, and an allowed rebuild
    function called it, up to ``eval``."""
    marker = tmp_path / 'executed'
    poisoned = (glob('mmengine.logging.history_buffer', 'HistoryBuffer') + pickle.EMPTY_TUPLE
                + pickle.NEWOBJ + pickle.EMPTY_DICT + text('statistics_methods')
                + pickle.EMPTY_DICT + text('__init__')
                + call(glob('builtins', 'getattr'),
                       glob('mmengine.logging.history_buffer', 'HistoryBuffer'), text('__init__'))
                + pickle.SETITEM + pickle.SETITEM + pickle.BUILD)
    escalate = call(glob('torch._tensor', '_rebuild_from_type_v2'),
                    call(glob('builtins', 'getattr'),
                         glob('mmengine.logging.history_buffer', 'HistoryBuffer'),
                         text('__init__')),
                    glob('builtins', 'eval'), text(f'__import__("os").system("touch {marker}")'),
                    pickle.EMPTY_DICT)
    path = torch_zip(tmp_path / 'poison.pth', pickled(pickle.MARK, poisoned, escalate,
                                                      pickle.TUPLE))
    refused(path, loaders, ['torch', 'foreign'], 'asks for the global torch._tensor.'
            '_rebuild_from_type_v2.*could run code')
    with pytest.raises(foreign_pickle.ForeignPickleError):
        foreign_read(path)
    assert not marker.exists()


@pytest.mark.parametrize('how', ['reduce', 'newobj', 'build_on_class', 'handed_callable'])
def test_a_call_of_anything_but_a_builder_is_refused(tmp_path, loaders, how):
    marker = tmp_path / 'executed'
    command = text(f'touch {marker}')
    body = {
        'reduce': call(glob('posix', 'system'), command),
        'newobj': glob('subprocess', 'Popen') + pickle.MARK + text('touch') + text(str(marker))
        + pickle.LIST + pickle.TUPLE1 + pickle.NEWOBJ,
        # BUILD on a class sets its attributes (dump_patches, __name__: the legacy .patch file)
        'build_on_class': glob('collections', 'Counter') + pickle.EMPTY_DICT
        + text('dump_patches') + pickle.NEWTRUE + pickle.SETITEM + pickle.BUILD,
        # a callable reached through an allowed builder's result is still no builder
        'handed_callable': call(call(glob('builtins', 'getattr'),
                                     glob('mmengine.logging.history_buffer', 'HistoryBuffer'),
                                     text('__init__')), command)}[how]
    path = torch_zip(tmp_path / 'evil.pth', pickled(body))
    refused(path, loaders, ['torch', 'foreign'], f'Refusing to load {path}: its pickle asks for')
    with pytest.raises(foreign_pickle.ForeignPickleError):
        foreign_read(path)
    assert not marker.exists()


@pytest.mark.parametrize('save', [dict(), dict(pickle_protocol=4)],
                         ids=['protocol 2', 'protocol 4'])
def test_torch_saved_code_is_refused_on_both_loaders(tmp_path, loaders, save):
    marker = tmp_path / 'executed'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'payload': RunsCode(marker)}, path, **save)
    refused(str(path), loaders, ['torch', 'foreign'],
            'its pickle asks for the global posix.system.*could run code')
    assert not marker.exists()


def test_a_persistent_id_other_than_a_storage_writes_no_file(tmp_path, loaders):
    target = tmp_path / 'written.patch'
    pid = pickle.MARK + text('module') + glob('collections', 'Counter') + text(str(target)) \
        + pickle.TUPLE + pickle.BINPERSID
    path = torch_zip(tmp_path / 'patch.pth', pickled(pid))
    refused(path, loaders, ['torch', 'foreign'], 'asks for')
    assert not target.exists()


def test_torchs_legacy_format_and_tar_are_refused_before_any_loader(tmp_path, loaders):
    marker = tmp_path / 'executed'
    legacy = tmp_path / 'legacy.pth'
    torch.save({'w': torch.ones(1), 'payload': RunsCode(marker)}, legacy,
               _use_new_zipfile_serialization=False)
    refused(str(legacy), loaders, [], r"torch's legacy format .*weights_only=False")
    # a tar with a link out of its folder: torch's oldest format, which nothing extracts here
    tarred = tmp_path / 'old.tar'
    with tarfile.open(tarred, 'w') as archive:
        link = tarfile.TarInfo('storages')
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / 'outside')
        archive.addfile(link)
    refused(str(tarred), loaders, [], 'it is not a PyTorch checkpoint')
    assert not marker.exists() and not (tmp_path / 'outside').exists()


# -- the corpus: memory safety and state --------------------------------------------------


@pytest.mark.parametrize('state', ['object_field', 'object_dtype'])
def test_a_numpy_dtype_is_never_given_an_object_field(tmp_path, loaders, state):
    """BUILD on a copied dtype gave it an object field; numpy then read bytes as a pointer."""
    dtype = call(glob('numpy', 'dtype'), text('O' if state == 'object_dtype' else 'V8'),
                 pickle.NEWFALSE, pickle.NEWTRUE)
    build = (pickle.MARK + integer(3) + text('|') + pickle.NONE + pickle.MARK + text('a')
             + pickle.TUPLE + pickle.EMPTY_DICT + integer(8) + integer(1) + integer(63)
             + pickle.TUPLE + pickle.BUILD)
    scalar = call(glob('numpy.core.multiarray', 'scalar'), dtype + build,
                  call(glob('_codecs', 'encode'), text('\x00' * 8), text('latin1')))
    path = torch_zip(tmp_path / 'dtype.pth', pickled(pickle.EMPTY_DICT, text('meta'),
                                                     pickle.EMPTY_DICT, text('seed'), scalar,
                                                     pickle.SETITEM, pickle.SETITEM))
    refused(path, loaders, ['torch', 'foreign'], 'numpy')


@pytest.mark.parametrize('state', ['odd_fields', 'built_twice', 'namespace_key'])
def test_an_allowed_class_built_oddly_is_refused(tmp_path, loaders, state):
    """HistoryBuffer and Namespace are allowed names; what a BUILD hands them is still checked:
    fields of the wrong kind, a second BUILD, an attribute name that is no string."""
    buffer = (glob('mmengine.logging.history_buffer', 'HistoryBuffer') + pickle.EMPTY_TUPLE
              + pickle.NEWOBJ)
    odd = (pickle.EMPTY_DICT + text('_log_history') + pickle.EMPTY_LIST + pickle.SETITEM
           + text('_count_history') + pickle.EMPTY_LIST + pickle.SETITEM + text('max_length')
           + text('all') + pickle.SETITEM + pickle.BUILD)
    body = {'odd_fields': buffer + odd,
            'built_twice': buffer + odd + pickle.EMPTY_DICT + pickle.BUILD,
            'namespace_key': glob('argparse', 'Namespace') + pickle.EMPTY_TUPLE + pickle.NEWOBJ
            + pickle.EMPTY_DICT + integer(1) + text('x') + pickle.SETITEM + pickle.BUILD}[state]
    path = torch_zip(tmp_path / 'odd.pth', pickled(body))
    refused(path, loaders, ['torch', 'foreign'],
            {'odd_fields': r'\(log_history\) is not a stored numpy array',
             'built_twice': 'BUILD on a dict', 'namespace_key': 'argparse.Namespace state'}[state])


def test_a_tensor_past_its_storage_is_refused(tmp_path, loaders):
    path = torch_zip(tmp_path / 'past.pth', pickled(storage_tensor('0', 4, 8)),
                     {'0': b'\0' * 16})
    with pytest.raises(CheckpointError):
        read_checkpoint(path)
    assert loaders[0] == 'torch'
    with pytest.raises(foreign_pickle.ForeignPickleError, match='past its storage'):
        foreign_read(path)
    # stride 0: 2**40 elements over one float, which a copy to a device would materialise
    expanded = torch_zip(tmp_path / 'expanded.pth', pickled(storage_tensor('0', 1, 1 << 40, 0)),
                         {'0': b'\0' * 4})
    with pytest.raises(foreign_pickle.ForeignPickleError, match='more elements than its storage'):
        foreign_read(expanded)
    wrong = torch_zip(tmp_path / 'wrong.pth', pickled(storage_tensor('0', 1 << 30, 4)),
                      {'0': b'\0' * 16})
    with pytest.raises(foreign_pickle.ForeignPickleError, match='is not 1073741824 elements'):
        foreign_read(wrong)


def test_concurrent_loads_leave_torchs_own_loader_as_strict_as_before(tmp_path):
    """The old loader widened torch's allow-list for the process during its loads."""
    foreign_file = str(tmp_path / 'mmengine.pth')
    torch.save({'meta': {'seed': np.int64(3)}, 'state_dict': {'w': torch.ones(2)}},
               foreign_file)
    ours = str(tmp_path / 'ours.pth')
    torch.save(to_plain({'meta': {'seed': np.int64(3)}, 'state_dict': {'w': torch.ones(2)}}),
               ours)
    failures = []

    def ours_and_foreign():
        for _ in range(20):
            for path in (foreign_file, ours):
                if read_checkpoint(path)['meta']['seed'] != 3:
                    failures.append('wrong value')

    def plain_torch():
        for _ in range(20):
            try:
                torch.load(foreign_file, weights_only=True)
                failures.append('plain torch.load accepted numpy')
            except pickle.UnpicklingError:
                pass

    threads = [threading.Thread(target=f) for f in (ours_and_foreign, ours_and_foreign,
                                                    plain_torch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# -- the corpus: bounded time and memory --------------------------------------------------


def test_deep_nesting_is_refused_by_name_without_crashing(tmp_path):
    """A tuple key nested 100,000 deep crashes CPython's hash; a deep list exhausts any walk."""
    deep_tuple = pickle.EMPTY_TUPLE + pickle.TUPLE1 * 100_000
    deep_list = pickle.EMPTY_LIST * 100_000 + pickle.APPEND * 99_999
    cases = {'tuple': pickled(pickle.EMPTY_DICT, deep_tuple, integer(1), pickle.SETITEM),
             'list': pickled(pickle.EMPTY_LIST, deep_list, pickle.APPEND)}
    for name, data in cases.items():
        path = torch_zip(tmp_path / f'{name}.pth', data)
        script = ('from mst_mm.engine import read_checkpoint\n'
                  'from mst_mm.errors import CheckpointError\n'
                  f'try:\n    read_checkpoint({path!r})\n'
                  'except CheckpointError as e:\n    print(e)\n')
        result = subprocess.run([sys.executable, '-c', script], capture_output=True,
                                text=True, timeout=120, cwd=REPO)
        assert result.returncode == 0, result.stderr[-2000:]
        assert 'more than 64' in result.stdout, result.stdout


def test_a_value_shared_2_to_the_60_times_is_walked_once(tmp_path, loaders):
    """Each list holds the one before it twice: 60 levels reach 2**60 paths, 120 objects."""
    body = pickle.EMPTY_LIST + pickle.BINPUT + b'\0' + pickle.POP
    for level in range(1, 61):
        body += (pickle.EMPTY_LIST + (pickle.BINGET + bytes([level - 1]) + pickle.APPEND) * 2
                 + pickle.BINPUT + bytes([level]) + pickle.POP)
    body += pickle.BINGET + bytes([60])
    path = torch_zip(tmp_path / 'shared.pth', pickled(body))
    loaded = read_checkpoint(path)
    assert loaded[0] is loaded[1] and loaders[0] == 'torch'  # torch's, or ours after it
    shared = from_plain(foreign_read(path))
    assert shared[0] is shared[1]


def test_zip_bombs_and_oversized_pickles_are_refused_before_reading(tmp_path, loaders,
                                                                    monkeypatch):
    bomb = torch_zip(tmp_path / 'bomb.pth', pickled(text('\0' * (50 << 20))), compress=True)
    assert os.path.getsize(bomb) < 1 << 20
    refused(bomb, loaders, [], 'it compresses its entries')
    monkeypatch.setattr(safe_loading, 'MAX_PICKLE_BYTES', 1000)
    data = pickled(text('x' * 2000))
    big = torch_zip(tmp_path / 'big.pth', data)
    refused(big, loaders, [], f'its pickle is {len(data)} bytes, more than the 1000')


def test_an_entry_claiming_more_bytes_than_the_file_is_refused(tmp_path, loaders):
    path = torch_zip(tmp_path / 'liar.pth', pickled(pickle.NONE))
    data = bytearray(Path(path).read_bytes())
    central = data.rindex(b'PK\x01\x02')  # the last entry's central-directory record
    data[central + 24:central + 28] = struct.pack('<I', 1 << 31)  # its uncompressed size
    Path(path).write_bytes(bytes(data))
    refused(path, loaders, [], 'claim more bytes than the file has')


# -- genuine files ------------------------------------------------------------------------


def mmengine_checkpoint(path, hub_name: str = 'safe_loading_test') -> str:
    """What mmengine's runner saved before this project stored plain forms (and what any
    mmengine or mmpretrain run saves): numpy scalars and arrays, a message hub of
    HistoryBuffers, one of them never updated, an empty array."""
    hub = MessageHub.get_instance(hub_name)
    hub.update_scalar('train/loss', np.float64(1.5))
    hub.update_scalar('train/loss', 2.5)
    hub._log_scalars['train/unused'] = HistoryBuffer()
    hub._resumed_keys['train/unused'] = True
    weights = OrderedDict(w=torch.arange(4.).reshape(2, 2).t(), b=torch.ones(0))
    weights._metadata = OrderedDict({'': {'version': 2}})
    torch.save(dict(meta=dict(epoch=1, seed=np.int64(7), hist=np.arange(3), empty=np.zeros(0),
                              dataset_meta=dict(classes=('cat', 'dog'))),
                    message_hub=hub.state_dict(), state_dict=weights,
                    param_schedulers=[dict(milestones=Counter({8: 1, 11: 1}))],  # MultiStepLR's
                    random_state=dict(numpy=np.random.RandomState(0).get_state())), path)
    return str(path)


def check_mmengine_checkpoint(loaded: dict) -> None:
    assert loaded['meta']['seed'] == 7 and isinstance(loaded['meta']['seed'], np.int64)
    assert loaded['meta']['hist'].tolist() == [0, 1, 2] and loaded['meta']['empty'].shape == (0,)
    buffer = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer) and buffer.mean() == 2.0  # (1.5 + 2.5) / 2
    assert loaded['message_hub']['log_scalars']['train/unused'].data[0].shape == (0,)
    assert torch.equal(loaded['state_dict']['w'], torch.arange(4.).reshape(2, 2).t())
    assert loaded['state_dict']._metadata == {'': {'version': 2}}
    milestones = loaded['param_schedulers'][0]['milestones']
    assert type(milestones) is Counter and milestones == Counter({8: 1, 11: 1})
    key = loaded['random_state']['numpy'][1]
    assert key.dtype == np.uint32 and np.array_equal(key, np.random.RandomState(0).get_state()[1])


def test_an_mmengine_checkpoint_loads_through_the_foreign_reader(tmp_path, loaders):
    path = mmengine_checkpoint(tmp_path / 'epoch_1.pth')
    before = process_state()
    check_mmengine_checkpoint(read_checkpoint(path))
    assert loaders == ['torch', 'foreign']
    assert process_state() == before
    check_mmengine_checkpoint(from_plain(foreign_read(path)))
    with pytest.raises(pickle.UnpicklingError):  # torch's own loader still refuses it
        torch.load(path, weights_only=True)


def test_the_plain_form_loads_with_torchs_own_loader_and_rebuilds_the_same_values(tmp_path,
                                                                                  loaders):
    foreign = read_checkpoint(mmengine_checkpoint(tmp_path / 'old.pth'))
    path = tmp_path / 'plain.pth'
    torch.save(to_plain(foreign), path)
    raw = torch.load(path, weights_only=True)  # torch's loader, nothing added
    assert raw['meta']['seed'][TAG] == 'numpy_scalar'
    loaders.clear()
    check_mmengine_checkpoint(read_checkpoint(str(path)))
    assert loaders == ['torch']
    # the foreign reader reads the plain form too
    check_mmengine_checkpoint(from_plain(foreign_read(str(path))))


def test_a_plain_form_that_lies_about_its_bytes_or_dtype_is_refused(tmp_path):
    array = to_plain(np.arange(4, dtype=np.int32))
    for change, match in [(dict(shape=[5]), 'do not match'), (dict(dtype='|O'), 'only numbers'),
                          (dict(dtype='i4,i4'), 'only numbers'), (dict(shape='4'), 'no shape'),
                          (dict(data=torch.zeros(4)), 'do not match')]:
        with pytest.raises(CheckpointError, match=match):
            from_plain({'a': {**array, **change}})
    with pytest.raises(CheckpointError, match='save the checkpoint.*a builtins.set'):
        to_plain({'a': {1}}, 'the checkpoint')
    cycle = []
    cycle.append(cycle)
    with pytest.raises(CheckpointError, match='contains itself'):
        from_plain(cycle)


def test_a_dino_checkpoints_namespace_becomes_a_dict(tmp_path, loaders):
    import argparse
    path = tmp_path / 'checkpoint.pth'
    torch.save({'teacher': {'backbone.cls_token': torch.zeros(1, 1, 2)}, 'epoch': 3,
                'args': argparse.Namespace(arch='vit_small', lr=5e-4)}, path)
    loaded = read_checkpoint(str(path))
    assert loaded['args'] == {'arch': 'vit_small', 'lr': 5e-4} and loaders == ['torch', 'foreign']


def test_a_url_is_cached_by_a_hash_of_the_whole_url(tmp_path, monkeypatch):
    served = {'https://example.org/good/model.pth': mmengine_checkpoint(tmp_path / 'good.pth'),
              'https://example.org/evil/model.pth': str(tmp_path / 'evil.pth')}
    marker = tmp_path / 'executed'
    torch.save({'payload': RunsCode(marker)}, served['https://example.org/evil/model.pth'])
    downloads = []

    def urlopen(url, timeout):
        downloads.append(url)
        if url not in served:
            raise OSError('connection refused')
        return io.BytesIO(Path(served[url]).read_bytes())

    monkeypatch.setattr(safe_loading.urllib.request, 'urlopen', urlopen)
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    with pytest.raises(CheckpointError, match='example.org/evil/model.pth: Refusing to load'):
        read_checkpoint('https://example.org/evil/model.pth')
    for _ in range(2):
        check_mmengine_checkpoint(read_checkpoint('https://example.org/good/model.pth'))
    assert downloads == list(served)[::-1]
    assert len(os.listdir(tmp_path / 'hub' / 'checkpoints')) == 2
    with pytest.raises(CheckpointError, match='Cannot download https://example.org/x.pth '
                                              r'\(OSError: connection refused\)'):
        read_checkpoint('https://example.org/x.pth')
    with pytest.raises(CheckpointError, match='Download it and give the local path'):
        read_checkpoint('open-mmlab://resnet50_caffe')
    assert not marker.exists()


def test_a_missing_empty_truncated_or_foreign_file_is_named_with_what_is_wrong(tmp_path):
    with pytest.raises(CheckpointError, match=f'Checkpoint {tmp_path}/none.pth does not exist'):
        read_checkpoint(str(tmp_path / 'none.pth'))
    data = Path(mmengine_checkpoint(tmp_path / 'full.pth')).read_bytes()
    for name, content, why in [
            ('empty.pth', b'', 'the file is empty (0 bytes)'),
            ('cut.pth', data[:len(data) // 2],
             f'the file is truncated ({len(data) // 2} bytes, the end of its zip archive'),
            ('notes.pth', b'these are notes\n', 'it is not a PyTorch checkpoint')]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError) as error:
            read_checkpoint(str(tmp_path / name), mmap=True)
        assert str(error.value).startswith(f'Cannot read checkpoint {tmp_path / name}: {why}')


def test_a_training_checkpoint_of_ours_loads_with_plain_torch_load(tmp_path):
    """Whatever the runner and its hooks put in a checkpoint (the message hub's history, the
    numpy RNG state, numpy values in the runtime info) is stored in plain form."""
    data_root = make_image_folder(tmp_path / 'data', classes=1, per_class=4)
    runner = build_runner(tiny_runner_cfg(data_root, tmp_path / 'work'))
    runner.message_hub.update_info('numpy_info', np.float32(0.5), resumed=True)
    runner.train()
    path = tmp_path / 'work' / 'epoch_2.pth'
    raw = torch.load(path, weights_only=True)  # torch's loader, nothing added
    assert raw['message_hub']['log_scalars']['train/loss'][TAG] == 'HistoryBuffer'
    assert raw['random_state']['numpy'][1][TAG] == 'ndarray'
    loaded = read_checkpoint(str(path))
    assert isinstance(loaded['message_hub']['log_scalars']['train/loss'], HistoryBuffer)
    assert loaded['message_hub']['runtime_info']['numpy_info'] == np.float32(0.5)
    assert loaded['random_state']['numpy'][1].dtype == np.uint32


def test_an_mmpretrain_released_checkpoint_gives_its_backbone(tmp_path, loaders):
    """mmpretrain's model zoo: ``meta`` (with numpy values in older releases) and a
    ``state_dict`` of an ImageClassifier; the converters take its ``backbone.*``."""
    from mst_mm.converters import backbone_state
    weights = OrderedDict([('backbone.cls_token', torch.zeros(1, 1, 4)),
                           ('backbone.layers.0.ln1.weight', torch.ones(4)),
                           ('head.layers.head.weight', torch.ones(10, 4))])
    path = tmp_path / 'vit-small_in1k.pth'
    torch.save({'meta': {'mmpretrain_version': '1.0.0', 'epoch': 300, 'seed': np.int64(0),
                         'dataset_meta': {'classes': ('tench', 'goldfish')}},
                'state_dict': weights}, path)
    backbone = backbone_state(str(path), 'student')
    assert sorted(backbone) == ['cls_token', 'layers.0.ln1.weight'] and loaders == ['torch',
                                                                                    'foreign']
