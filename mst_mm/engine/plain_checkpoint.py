"""Checkpoints that torch's own weights-only loader reads, with nothing added, on every
supported torch (2.1 included).

mmengine's Runner saves numpy arrays (the numpy RNG state, numpy values in the meta) and
``HistoryBuffer`` objects (the message hub's logged history); torch's weights-only loader
refuses both. :func:`to_plain` stores each as a tagged dict of tensors and plain values just
before the save; :func:`from_plain` builds them again after a load, through their
constructors only (never ``__setstate__``)::

    numpy array / scalar -> {TAG: 'ndarray' | 'numpy_scalar', 'dtype': '<u4', 'shape': [624],
                             'data': uint8 tensor of the C-ordered bytes}
    HistoryBuffer        -> {TAG: 'HistoryBuffer', 'log_history': <ndarray form>,
                             'count_history': <ndarray form>, 'max_length': int}
    collections.Counter  -> {TAG: 'Counter', 'counts': dict}  (MultiStepLR's milestones)

Everything else a checkpoint holds must already be tensors, ``torch.Size``, ``None``, bools,
ints, floats, strings, lists, tuples, dicts or ``OrderedDict`` s; anything else is refused at
save time, naming where it sits.
"""
from collections import Counter, OrderedDict
from typing import Any, Dict

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

from mst_mm.errors import CheckpointError

__all__ = ['MAX_DEPTH', 'TAG', 'from_plain', 'to_plain']

#: The key that marks a dict as the plain form of a numpy value or a ``HistoryBuffer``.
TAG = '__mst_mm_plain__'
#: Deepest nesting of containers in a checkpoint (ours are under 10 deep).
MAX_DEPTH = 64
#: Largest numpy array rebuilt from a checkpoint (a training checkpoint's are a few KB).
MAX_ARRAY_BYTES = 1 << 30
_ATOMS = (type(None), bool, int, float, str, torch.Tensor, torch.Size)


def _plain_array(value: np.ndarray, kind: str) -> Dict[str, Any]:
    if value.dtype.kind not in 'biufc' or value.dtype.fields is not None:
        raise TypeError(f'a numpy value of dtype {value.dtype} (only numbers can be stored)')
    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    return {TAG: kind, 'dtype': value.dtype.str, 'shape': list(value.shape),
            'data': torch.from_numpy(data.copy())}


def to_plain(obj: Any, where: str = 'checkpoint', depth: int = 0) -> Any:
    """``obj`` with each numpy value and ``HistoryBuffer`` in its plain form (see above).

    Raises:
        CheckpointError: ``obj`` holds something torch's weights-only loader cannot read;
            the message names its place (``where``) and type.
    """
    if depth > MAX_DEPTH:
        raise CheckpointError(f'{where} is nested more than {MAX_DEPTH} containers deep.')
    try:
        if isinstance(obj, np.ndarray):
            return _plain_array(obj, 'ndarray')
        if isinstance(obj, np.generic):  # before the atoms: np.float64 is a float
            return _plain_array(np.asarray(obj), 'numpy_scalar')
        if isinstance(obj, _ATOMS):
            return obj
        if isinstance(obj, HistoryBuffer):
            log, count = obj.data
            return {TAG: 'HistoryBuffer', 'log_history': _plain_array(log, 'ndarray'),
                    'count_history': _plain_array(count, 'ndarray'),
                    'max_length': int(obj.max_length)}
    except TypeError as error:
        raise CheckpointError(f'Cannot save {where}: it holds {error}.') from None
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(to_plain(v, f'{where}[{i}]', depth + 1) for i, v in enumerate(obj))
    if type(obj) is Counter:
        return {TAG: 'Counter', 'counts': to_plain(dict(obj), where, depth + 1)}
    if type(obj) in (dict, OrderedDict):
        plain = type(obj)((k, to_plain(v, f'{where}[{k!r}]', depth + 1)) for k, v in obj.items())
        if hasattr(obj, '_metadata'):  # a state dict's module versions
            plain._metadata = obj._metadata
        return plain
    raise CheckpointError(
        f'Cannot save {where}: it holds a {type(obj).__module__}.{type(obj).__qualname__}, '
        "which torch's weights-only loader does not read. Store tensors, numbers, strings, "
        'lists, tuples or dicts there.')


def _array(plain: Any, where: str) -> np.ndarray:
    """The numpy value of a plain form, checked: numbers only, its bytes matching its shape,
    nothing materialised before the sizes agree."""
    if not (isinstance(plain, dict) and plain.get(TAG) in ('ndarray', 'numpy_scalar')):
        raise CheckpointError(f'{where} is not a stored numpy array.')
    dtype, shape, data = plain.get('dtype'), plain.get('shape'), plain.get('data')
    try:
        dtype = np.dtype(dtype) if isinstance(dtype, str) else None
        shape = tuple(shape) if isinstance(shape, (list, tuple)) and len(shape) <= 32 else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in 'biufc' or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise CheckpointError(f'{where} is a numpy array of dtype {plain.get("dtype")!r}: '
                              'only numbers load.')
    if shape is None or any(type(n) is not int or n < 0 for n in shape):
        raise CheckpointError(f'{where}: its shape {plain.get("shape")!r} is no shape.')
    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 1 \
            and data.numel() == size <= MAX_ARRAY_BYTES:
        data = data.contiguous().numpy().tobytes()
    if not isinstance(data, bytes) or len(data) != size or size > MAX_ARRAY_BYTES:
        raise CheckpointError(f'{where}: its bytes do not match its dtype {dtype} and shape '
                              f'{shape}.')
    order = 'F' if plain.get('fortran') is True else 'C'
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy(order='C')
    return array[()] if plain[TAG] == 'numpy_scalar' else array


def _history_buffer(plain: dict, where: str) -> HistoryBuffer:
    log = _array(plain.get('log_history'), f'{where} (log_history)')
    count = _array(plain.get('count_history'), f'{where} (count_history)')
    max_length = plain.get('max_length')
    if (log.ndim != 1 or log.shape != count.shape or type(max_length) is not int
            or not 0 < max_length <= 10**9):
        raise CheckpointError(f'{where} is a malformed HistoryBuffer.')
    return HistoryBuffer(log, count, max_length)


def _short(key: Any) -> str:
    """A dict key for a message: a repr of an atom, else only its type (a key nested deep
    enough would exhaust repr)."""
    return repr(key)[:80] if isinstance(key, (str, int, float, bool, type(None))) else \
        f'<{type(key).__name__}>'


def from_plain(obj: Any, where: str = 'checkpoint') -> Any:
    """``obj`` with each plain form that :func:`to_plain` (or the foreign-pickle reader)
    wrote built again; every other value is returned as it is. Shared values stay shared;
    a cycle, or nesting deeper than :data:`MAX_DEPTH`, is refused."""
    done: Dict[int, Any] = {}
    on_path = set()

    def walk(value: Any, where: str, depth: int) -> Any:
        if isinstance(value, (*_ATOMS, bytes, np.ndarray, np.generic)):
            return value
        key = id(value)
        if key in done:
            return done[key]
        if key in on_path:
            raise CheckpointError(f'{where} contains itself: no checkpoint does.')
        if depth > MAX_DEPTH:
            raise CheckpointError(f'{where} is nested more than {MAX_DEPTH} containers deep.')
        on_path.add(key)
        if isinstance(value, dict) and TAG in value:
            kind, counts = value[TAG], value.get('counts')
            result = (_history_buffer(value, where) if kind == 'HistoryBuffer' else
                      Counter(walk(counts, where, depth + 1)) if kind == 'Counter'
                      and type(counts) is dict else _array(value, where))
        elif isinstance(value, (list, tuple)):
            result = type(value)(walk(v, f'{where}[{i}]', depth + 1)
                                 for i, v in enumerate(value))
        elif isinstance(value, dict):
            items = {k: walk(v, f'{where}[{_short(k)}]', depth + 1) for k, v in value.items()}
            result = type(value)(items) if type(value) in (OrderedDict, Counter) else items
            if hasattr(value, '_metadata'):
                result._metadata = value._metadata
        else:
            result = value
        on_path.discard(key)
        done[key] = result
        return result

    return walk(obj, where, 0)
