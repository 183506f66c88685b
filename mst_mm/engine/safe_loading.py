"""Weights-only checkpoint loads (mmengine's globals allowed for ours only, on every supported
torch), checked for fit."""
import _compat_pickle
import codecs
import io
import logging
import os
import os.path as osp
import pickle
import pickletools
import re
import types
import zipfile
from collections import Counter, OrderedDict
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import urlparse

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.dist import get_dist_info
from mmengine.logging import HistoryBuffer, print_log
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner import Runner
from mmpretrain.registry import RUNNERS
from mmpretrain.utils import get_ori_model

from mst_mm.compat import HAS_SAFE_GLOBALS, get_safe_globals
from mst_mm.errors import CheckpointError, some_keys

__all__ = ['CheckedPretrainedInit', 'CheckedRunner', 'build_runner', 'check_training_checkpoint',
           'load_checked', 'read_checkpoint', 'state_dict_of']
_SIZE_MISMATCH = re.compile(r'size mismatch for (\S+): .*?Size\(\[(.*?)\]\).*?Size\(\[(.*?)\]\)')


def _history_buffer_method(obj: Any, name: str) -> Any:
    """``getattr``, as pickle stores the message hub's ``HistoryBuffer.mean`` & co, only."""
    if obj is not HistoryBuffer or name not in {'min', 'max', 'current', 'mean',
                                                *HistoryBuffer._statistics_methods}:
        raise RuntimeError(f'Refusing getattr({obj!r}, {name!r}) while loading a checkpoint.')
    return getattr(obj, name)


def _mmengine_globals() -> List[Any]:
    """The globals of an mmengine training checkpoint, under numpy 1's and numpy 2's names."""
    rebuilders = (('_reconstruct', np.zeros(1).__reduce__()[0]),
                  ('scalar', np.float64(0).__reduce__()[0]))
    return [np.ndarray, np.dtype, HistoryBuffer, (_history_buffer_method, 'builtins.getattr'),
            *{type(np.dtype(c)) for c in '?' + np.typecodes['AllInteger'] + 'efd'},  # dtype classes
            *[(function, f'numpy.{core}.multiarray.{name}') for core in ('core', '_core')
              for name, function in rebuilders]]


def _allowed_globals(extra: Sequence[Any] = ()) -> Dict[str, Any]:
    """``'module.name'`` -> object of every global a checkpoint may name: torch's own
    weights-only defaults, mmengine's (:func:`_mmengine_globals`) and ``extra``."""
    from torch._weights_only_unpickler import _get_allowed_globals
    # protocol 2 pickles bytes (numpy arrays' data) as _codecs.encode calls: torch's own
    # defaults allow it since 2.4 (with safe_globals); torch 2.1's list lacks it.
    allowed = {'_codecs.encode': codecs.encode, **_get_allowed_globals()}
    for entry in [*_mmengine_globals(), *extra]:
        obj, name = entry if isinstance(entry, tuple) else (
            entry, f'{entry.__module__}.{entry.__qualname__}')
        allowed[name] = obj
    return allowed


class UnsafeGlobalError(pickle.UnpicklingError):
    """A checkpoint's pickle names a global outside the allow-list: loading it could run
    code. ``name`` is the global's ``'module.name'``."""

    def __init__(self, name: str) -> None:
        super().__init__(f'it names the global {name}, which no checkpoint of ours holds')
        self.name = name


def _restricted_pickle(allowed: Dict[str, Any]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler finds only ``allowed``'s globals:
    weights-only loading with an allow-list on a torch without ``safe_globals`` (< 2.5).
    torch's own loader keeps its handling of storages and tensors around it."""
    class AllowListUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            full_name = _python3_name(module, name)
            try:
                return allowed[full_name]
            except KeyError:
                raise UnsafeGlobalError(full_name) from None

    def load(file, **kwargs) -> Any:
        return AllowListUnpickler(file, **kwargs).load()

    restricted = types.ModuleType('mst_mm_allow_list_pickle')
    restricted.Unpickler, restricted.load = AllowListUnpickler, load
    restricted.UnpicklingError = pickle.UnpicklingError
    return restricted


def _python3_name(module: str, name: str) -> str:
    """``'module.name'`` as Python 3's unpickler resolves it: pickles of protocol 2 (torch.save's
    default) name Python 2's modules (``__builtin__.getattr``), which no later one can."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    return f'{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}'


def unsafe_global(filename: str, extra: Sequence[Any] = ()) -> Optional[str]:
    """The first global that ``filename``'s pickle names outside the allow-list of
    :func:`read_checkpoint`, found by reading the pickle's opcodes (nothing is loaded or run),
    or None (none, or not a pickle that can be read). How a refusal is recognised on every
    torch, whatever its error message says."""
    allowed = _allowed_globals(extra)
    try:
        if zipfile.is_zipfile(filename):
            with zipfile.ZipFile(filename) as archive:
                name = next(n for n in archive.namelist() if n.endswith('data.pkl'))
                data = archive.read(name)
        else:  # torch's legacy format: a few pickles in a row, then raw storages
            with open(filename, 'rb') as f:
                data = f.read()
        for name in _pickled_globals(data):
            if name not in allowed:
                return name
    except Exception:  # not a pickle we can read: no refusal to report
        return None
    return None


_STRING_OPS = {'SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8', 'UNICODE', 'SHORT_BINSTRING',
               'BINSTRING', 'STRING'}
_MEMO_PUTS = {'PUT', 'BINPUT', 'LONG_BINPUT'}
_MEMO_GETS = {'GET', 'BINGET', 'LONG_BINGET'}


def _pickled_globals(data: bytes) -> List[str]:
    """``'module.name'`` of each global that the pickles at the start of ``data`` name
    (``GLOBAL`` and ``INST`` carry it; ``STACK_GLOBAL`` takes the two strings pushed before
    it), up to the first bytes that are no pickle."""
    names: List[str] = []
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        pushed: List[Optional[str]] = []   # the values pushed, strings only (else None)
        memo: Dict[int, Optional[str]] = {}
        try:
            for opcode, arg, _ in pickletools.genops(stream):
                op = opcode.name
                if op in ('GLOBAL', 'INST'):
                    names.append(_python3_name(*arg.split(' ', 1)))
                elif op == 'STACK_GLOBAL':
                    names.append(_python3_name(*map(str, (pushed[-2:] + [''] * 2)[:2])))
                if op in _STRING_OPS:
                    pushed.append(arg)
                elif op in _MEMO_GETS:
                    pushed.append(memo.get(arg))
                elif op in _MEMO_PUTS or op == 'MEMOIZE':
                    memo[len(memo) if op == 'MEMOIZE' else arg] = pushed[-1] if pushed else None
                elif op == 'STOP':
                    break
                else:
                    pushed.append(None)
        except ValueError:  # raw bytes (the legacy format's storages) or a broken pickle
            break
    return names


def read_checkpoint(filename: str, map_location: Any = None, mmap: bool = False,
                    allow: Sequence[Any] = ()) -> Any:
    """Weights-only ``torch.load`` with mmengine's globals (and ``allow``'s) allowed in this
    call only. A pickle that names any other global is refused, naming it.

    On a torch with ``safe_globals`` (2.5 and later) torch's weights-only unpickler reads the
    file with the allow-list added for this call; on an older torch a restricted unpickler
    that finds exactly the same globals does. Nothing changes for the rest of the process.
    An ``http(s)://`` checkpoint is downloaded into torch's hub cache first, where mmengine
    keeps it too (mmengine itself loads URLs with pickle's full powers).
    """
    if filename.startswith(('http://', 'https://')):
        filename = _download(filename)
    elif '://' in filename:
        raise CheckpointError(f'Cannot read {filename}: only local files and http(s):// URLs '
                              'are read weights-only. Download it and give the local path.')
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise CheckpointError(f'Checkpoint {filename} does not exist.')
    mmap = mmap and zipfile.is_zipfile(filename)
    try:
        if HAS_SAFE_GLOBALS:
            with _allow_for_this_load(allow):
                return torch.load(filename, map_location=map_location, weights_only=True,
                                  mmap=mmap)
        return torch.load(filename, map_location=map_location, weights_only=False, mmap=mmap,
                          pickle_module=_restricted_pickle(_allowed_globals(allow)))
    except Exception as error:  # a foreign file makes torch.load raise anything
        refused = (error.name if isinstance(error, UnsafeGlobalError)
                   else unsafe_global(filename, allow))
        if refused is not None:
            raise CheckpointError(f'Refusing to load {filename}: it names the global '
                                  f'{refused}, which no checkpoint of ours holds. It could run '
                                  'code hidden in the file: use a checkpoint you trust.') from None
        # First sentences only: torch's messages go on with generic advice.
        lines = [line.strip().split('. ')[0].rstrip('.') for line in str(error).splitlines()
                 if line.strip()] or ['']
        reason = next((line for line in lines if 'WeightsUnpickler error' in line), lines[0])
        size = osp.getsize(filename)
        # torch.save's zip archive has its directory last: a kill or a full disk loses it.
        why = ('the file is empty (0 bytes)' if size == 0 else
               f'the file is truncated ({size} bytes, the end of its zip archive is missing):'
               ' the save that wrote it was probably interrupted' if 'zip archive' in reason
               and not zipfile.is_zipfile(filename) else
               f'it is not a PyTorch checkpoint, or it is corrupted ({size} bytes)')
        raise CheckpointError(f'Cannot read checkpoint {filename}: {why} '
                              f'({type(error).__name__}: {reason}). Use another checkpoint '
                              '(an earlier epoch_N.pth or a fresh copy).') from None


def _download(url: str) -> str:
    """The local copy of ``url`` in torch's hub cache (``TORCH_HOME``), downloaded once; in
    a distributed run rank 0 downloads while the others wait."""
    cached = osp.join(torch.hub.get_dir(), 'checkpoints', osp.basename(urlparse(url).path))
    rank, world_size = get_dist_info()
    if rank == 0 and not osp.isfile(cached):
        os.makedirs(osp.dirname(cached), exist_ok=True)
        torch.hub.download_url_to_file(url, cached)
    if world_size > 1:
        torch.distributed.barrier()
    return cached


def _allow_for_this_load(allow: Sequence[Any] = ()) -> AbstractContextManager:
    """torch's ``safe_globals`` with mmengine's globals and ``allow``'s that torch does not
    hold already (left as they are on the way out); nothing where torch has none."""
    if not HAS_SAFE_GLOBALS:
        return nullcontext()
    already = get_safe_globals()
    return torch.serialization.safe_globals(
        [g for g in [*_mmengine_globals(), *allow] if g not in already])


def check_training_checkpoint(filename: str) -> None:
    """Refuse a ``--resume`` file that is no training checkpoint (mmengine: a bare ``KeyError``)."""
    checkpoint = read_checkpoint(filename, map_location='cpu', mmap=True)
    if not isinstance(checkpoint, dict):
        problems, found = [f'it holds a {type(checkpoint).__name__}, not a dict'], ''
    else:
        meta, problems = checkpoint.get('meta'), []
        found = f' Its top-level keys: {", ".join(sorted(map(str, checkpoint))[:8]) or "none"}.'
        if not isinstance(meta, dict):
            problems.append("it has no 'meta' (epoch and iteration)")
        elif not {'epoch', 'iter'} <= set(meta):
            problems.append("its 'meta' has no epoch and iteration")
        if 'message_hub' not in checkpoint:
            problems.append("it has no 'message_hub' (the logged history)")
        if not isinstance(checkpoint.get('state_dict'), dict):
            problems.append("it has no 'state_dict' (the weights)")
    if problems:
        raise CheckpointError(
            f'Cannot resume from {filename}: it is not an mmengine training checkpoint '
            f'({"; ".join(problems)}).{found} --resume continues a run that tools/train.py saved '
            '(WORK_DIR/epoch_N.pth or latest.pth; --resume alone takes the newest). To start a new '
            f'run from these weights, drop --resume and pass --cfg-options load_from={filename}.')


def load_checked(module: nn.Module, state_dict: dict, source: str, what: str, fix: str,
                 allow_partial: bool = False, partial_hint: str = '', strict: bool = False):
    """``module.load_state_dict``, refusing weights of ``what`` left random (``allow_partial``:
    only if none loaded), a shape mismatch or (``strict``) an unexpected key, by name."""
    expected = [k for k in module.state_dict() if not k.endswith('num_batches_tracked')]
    try:
        result = module.load_state_dict(state_dict, strict=strict)
    except RuntimeError as error:  # torch raises on a shape mismatch even when not strict
        shapes = '; '.join(f'{key} is ({theirs}) in the checkpoint and ({ours}) in the model'
                           for key, theirs, ours in _SIZE_MISMATCH.findall(str(error))[:3])
        raise CheckpointError(f'{source} does not fit {what}: {shapes or error}. {fix}') from None
    missing = sorted(k for k in result.missing_keys if not k.endswith('num_batches_tracked'))
    if not missing:
        return
    sizes = Counter(k.partition('.')[0] if '.' in k else '' for k in expected)
    groups: Dict[str, List[str]] = {}  # missing keys by top-level module
    for head, tail in (k.split('.', 1) if '.' in k else ('', k) for k in missing):
        groups.setdefault(head, []).append(tail)
    summary = '; '.join(f'{name or "top level"}: {len(names)} of {sizes[name]} tensors '
                        f'({some_keys(sorted(names), 5)})' for name, names in groups.items())
    held = some_keys(sorted(result.unexpected_keys), 6) or 'no tensors'
    if len(missing) == len(expected):
        raise CheckpointError(f'{source} provides none of the {len(expected)} weights of {what}, '
                              f'which would stay randomly initialised: missing {summary}. The '
                              f'file holds {held}. It '
                              f'is not a checkpoint of this model. {fix}')
    message = (f'{source} provides {len(expected) - len(missing)} of the {len(expected)} weights '
               f'of {what}; not loaded, so left randomly initialised: {summary}.')
    if not allow_partial:
        raise CheckpointError(f'{message} {fix} {partial_hint}'.rstrip())
    print_log(f'{message} Partial load allowed: going on.', logger='current', level=logging.WARNING)


def state_dict_of(checkpoint: Any, source: str, revise_keys: Sequence = ()) -> dict:
    """The state dict in a loaded checkpoint (``'state_dict'`` if any), keys revised."""
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else 0
    if not isinstance(state_dict, dict):
        raise CheckpointError(f'{source} holds no state dict: it provides no weights.')
    revised = OrderedDict(state_dict)
    for pattern, replacement in revise_keys:
        revised = OrderedDict((re.sub(pattern, replacement, k), v) for k, v in revised.items())
    revised._metadata = getattr(state_dict, '_metadata', OrderedDict())  # module versions
    return revised


@WEIGHT_INITIALIZERS.register_module(name='CheckedPretrained')
class CheckedPretrainedInit(PretrainedInit):
    """mmengine's ``Pretrained``, weights-only, refusing a partial load unless ``allow_partial``."""

    def __init__(self, checkpoint: str, prefix: Optional[str] = None,
                 map_location: str = 'cpu', allow_partial: bool = False) -> None:
        super().__init__(checkpoint, prefix=prefix, map_location=map_location)
        self.allow_partial = allow_partial

    def __call__(self, module: nn.Module) -> None:
        what = f"the {type(module).__name__} (init_cfg type='CheckedPretrained')"
        fix = "Check the init_cfg's checkpoint and prefix ('teacher.module.0.': MST's teacher)."
        state_dict = state_dict_of(read_checkpoint(self.checkpoint, self.map_location),
                                    self.checkpoint, [] if self.prefix else [(r'^module\.', '')])
        if self.prefix:
            prefix = self.prefix.rstrip('.') + '.'
            selected = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
            if not selected:
                raise CheckpointError(f'{self.checkpoint} has no weights under the prefix '
                                      f'{prefix!r}; its keys: '
                                      f'{some_keys(sorted(state_dict), 6)}. {fix}')
            state_dict = selected
        load_checked(module, state_dict, self.checkpoint, what, fix, self.allow_partial,
                     'To load what matches and keep the rest random, add allow_partial=True '
                     'to the init_cfg.')
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())


@RUNNERS.register_module()
class CheckedRunner(Runner):
    """mmengine's ``Runner`` whose loads are weights-only and must provide every weight."""

    def load_checkpoint(self, filename: str, map_location: Any = 'cpu', strict: bool = False,
                        revise_keys: list = [(r'^module\.', '')]) -> dict:  # noqa: B006
        checkpoint = read_checkpoint(filename, map_location)
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)  # may rewrite it, first
        model = get_ori_model(self.model)
        load_checked(model, state_dict_of(checkpoint, filename, revise_keys), filename,
                     f"this config's {type(model).__name__}",
                     "Give a checkpoint of this config's model: an MST training checkpoint "
                     '(WORK_DIR/epoch_N.pth) or a state dict that the model accepts.',
                     bool(self.cfg.get('allow_partial_load', False)),
                     '--allow-partial (allow_partial_load=True in the config) loads what '
                     'matches and leaves the rest randomly initialised.', strict)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint


def build_runner(cfg: Config) -> Runner:
    """The config's ``runner_type`` (``CheckedRunner`` in ours), else mmengine's ``Runner``."""
    return RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
