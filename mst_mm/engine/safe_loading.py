"""Weights-only checkpoint loading that still reads mmengine's own checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default and mmengine 0.10.7 passes nothing,
so its training checkpoints (numpy arrays and ``HistoryBuffer`` objects in the message hub)
fail to load and ``--resume`` is broken (shared/ENVIRONMENT.md, trap 4). Instead of turning
weights-only loading off, this allow-lists exactly the globals those checkpoints hold.
"""
from typing import Any

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

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
