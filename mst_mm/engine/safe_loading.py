"""Weights-only checkpoint loading that still reads mmengine's own checkpoints.

torch >= 2.6 loads weights-only by default, which refuses mmengine's training checkpoints
(numpy arrays, ``HistoryBuffer``): this allow-lists exactly those globals and names the
file in every failure. ``import mst_mm`` changes no loader; see docs/reliability.md.
"""
import errno
import os.path as osp
import pickle
import zipfile
from typing import Any

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from .errors import CheckpointNotFoundError, UnreadableCheckpointError, UnsafeCheckpointError

_NUMERIC_DTYPES = ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32',
                   'uint64', 'float16', 'float32', 'float64')


def _history_buffer_method(obj: Any, name: str) -> Any:
    """``getattr`` for weights-only loads: pickle stores ``HistoryBuffer.min`` (the message
    hub's statistics) as ``getattr(HistoryBuffer, 'min')``; nothing else may use it."""
    allowed = {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods}
    if obj is HistoryBuffer and name in allowed:
        return getattr(obj, name)
    raise RuntimeError(f'Refusing getattr({obj!r}, {name!r}) while loading a checkpoint: '
                       'only HistoryBuffer statistics methods are allowed.')


def allow_mmengine_checkpoint_globals() -> None:
    """Register the globals of mmengine training checkpoints as safe for weights-only loads."""
    multiarray = np.core.multiarray
    torch.serialization.add_safe_globals([
        np.ndarray,
        np.dtype,
        # A dtype is rebuilt as an instance of its class, e.g. numpy.dtypes.Float64DType.
        *{type(np.dtype(name)) for name in _NUMERIC_DTYPES},
        (multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
        (multiarray.scalar, 'numpy.core.multiarray.scalar'),
        HistoryBuffer,
        (_history_buffer_method, 'builtins.getattr'),
    ])


def _describe_unreadable(filename: str, error: BaseException) -> str:
    """Why ``torch.load`` could not read ``filename``, in words a user can act on."""
    size = osp.getsize(filename)
    with open(filename, 'rb') as f:
        head = f.read(4)
    if size == 0:
        return 'the file is empty (0 bytes)'
    if head == b'PK\x03\x04' and not zipfile.is_zipfile(filename):
        # torch.save writes a zip archive whose directory comes last: a write cut short (a
        # kill, a full disk) loses it, and torch then reports a miniz or OS error.
        return (f'the file is truncated ({size} bytes, the end of its zip archive is '
                'missing): the save that wrote it was probably interrupted')
    return (f'it is not a PyTorch checkpoint, or it is corrupted ({size} bytes; '
            f'{type(error).__name__}: {_first_line(error)})')


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # torch's weights-only unpickler puts the actual reason after a paragraph of advice.
    for i, line in enumerate(lines[:-1]):
        if line.startswith('Please file an issue') or line.endswith('WeightsUnpickler error:'):
            return lines[i + 1]
    return lines[0] if lines else repr(error)


def read_checkpoint(filename: str, map_location: Any = None, mmap: bool = False) -> Any:
    """``torch.load(filename)``, weights-only, with errors that name the file and the fix.

    ``mmap=True`` maps the storage to look at a large checkpoint cheaply (legacy non-zip
    files are read in full).

    Raises:
        CheckpointNotFoundError: ``filename`` does not exist.
        UnsafeCheckpointError: the pickle asks for a global outside the allow-list, i.e.
            loading it could run code.
        UnreadableCheckpointError: the file is empty, truncated, corrupted or no checkpoint.
    """
    allow_mmengine_checkpoint_globals()
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise CheckpointNotFoundError(f'Checkpoint {filename} does not exist.')
    try:
        try:
            return torch.load(filename, map_location=map_location, weights_only=True,
                              mmap=mmap)
        except RuntimeError as error:
            if not (mmap and 'mmap can only be used' in str(error)):
                raise
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        lines = str(error).splitlines()
        reason = next((line.strip() for line in lines if 'GLOBAL' in line or 'global' in line),
                      None)
        if reason is None:  # not a refused global: the bytes are not a pickle of ours
            raise UnreadableCheckpointError(_unreadable_message(filename, error)) from None
        raise UnsafeCheckpointError(
            f'Refusing to load {filename}: it is not a plain weights checkpoint ({reason}). '
            'Loading it could run code hidden in the file. Use a checkpoint from a source '
            'you trust, or re-save its state_dict with torch.save.') from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM):
            raise UnreadableCheckpointError(
                f'Cannot read checkpoint {filename}: permission denied.') from None
        raise UnreadableCheckpointError(_unreadable_message(filename, error)) from None


def _unreadable_message(filename: str, error: BaseException) -> str:
    return (f'Cannot read checkpoint {filename}: {_describe_unreadable(filename, error)}. '
            'Use another checkpoint (the previous epoch_N.pth of the run, or a fresh copy of '
            'the file); this one is left as it is.')


def load_local_checkpoint(filename: str, map_location: Any = None) -> Any:
    """:func:`read_checkpoint` with the signature of mmengine's local loader."""
    return read_checkpoint(filename, map_location=map_location)


def load_checkpoint_safely(filename: str, map_location: Any = None) -> Any:
    """A local file through :func:`load_local_checkpoint`; a URL (``https://``, ``s3://``,
    ``open-mmlab://``...) through mmengine's loader for its scheme."""
    if '://' in filename:
        return CheckpointLoader.load_checkpoint(filename, map_location=map_location)
    return load_local_checkpoint(filename, map_location=map_location)


def install_weights_only_loader() -> None:
    """Opt in: make :func:`load_local_checkpoint` mmengine's loader for every local file in
    this process (``--resume``, ``load_from`` and ``init_cfg`` of any library's runner).
    ``import mst_mm`` never calls it."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint, force=True)
