"""Weights-only checkpoint loading that still reads mmengine's own checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default and mmengine 0.10.7 passes nothing,
so its training checkpoints (numpy arrays and ``HistoryBuffer`` objects in the message hub)
fail to load and ``--resume`` is broken (shared/ENVIRONMENT.md, trap 4). Instead of turning
weights-only loading off, this allow-lists exactly the globals those checkpoints hold.
"""
import os.path as osp
import pickle
from typing import Any

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

_NUMERIC_DTYPES = ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32',
                   'uint64', 'float16', 'float32', 'float64')


def _history_buffer_method(obj: Any, name: str) -> Any:
    """Stands in for ``getattr`` during weights-only loads.

    Pickle protocol 2 stores ``HistoryBuffer.min`` (kept in the message hub's statistics
    table) as ``getattr(HistoryBuffer, 'min')``; nothing else in a checkpoint may use it.
    """
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


def load_local_checkpoint(filename: str, map_location=None) -> Any:
    """mmengine's loader for local paths, weights-only and explicit about a refusal.

    Registered as CheckpointLoader's default scheme, so ``--resume``, ``load_from``,
    ``init_cfg=dict(type='Pretrained')`` and our tools all come through here. A refused
    pickle raises an ``UnpicklingError`` that names the file and the global it wanted.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'Checkpoint {filename} does not exist.')
    try:
        return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        lines = str(error).splitlines()
        reason = next((line.strip() for line in lines if 'GLOBAL' in line or 'global' in line),
                      lines[0] if lines else 'not a weights-only checkpoint')
        raise pickle.UnpicklingError(
            f'Refusing to load {filename}: it is not a plain weights checkpoint ({reason}). '
            'Loading it could run code hidden in the file. Use a checkpoint from a source '
            'you trust, or re-save its state_dict with torch.save.') from None


def install_weights_only_loader() -> None:
    """Make :func:`load_local_checkpoint` mmengine's loader for local files."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint, force=True)
