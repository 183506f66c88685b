"""The checkpoints torch's weights-only loader refuses, read at the opcode level into plain
data: an mmengine or mmpretrain training checkpoint (numpy values, the message hub's
``HistoryBuffer`` s), DINO's full checkpoint (its command line, an ``argparse.Namespace``).

No global that a file names is imported, called or changed. Each allowed global stands for
one builder of ours, which checks its arguments and makes plain data::

    torch._utils._rebuild_tensor(_v2), _rebuild_parameter  -> a tensor over the archive's
                                                              storage, bounds checked
    collections.OrderedDict, torch.Size, _codecs.encode, bytes  -> the same plain value
    collections.Counter                          -> plain_checkpoint's form of it
    numpy's _reconstruct / dtype / scalar        -> plain_checkpoint's form of the array
    mmengine's HistoryBuffer (NEWOBJ + BUILD)    -> plain_checkpoint's form of the buffer
    argparse.Namespace (NEWOBJ + BUILD)          -> a dict of its attributes

BUILD is accepted on those placeholders only (and a state dict's ``_metadata``), REDUCE on
those builders only, persistent ids name torch storages only, dict keys are atoms; any other
opcode is refused. :func:`check_structure` bounds what torch's own loader would hash.
"""
import _compat_pickle
import codecs
import math
import pickletools
import re
import zipfile
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from mst_mm.errors import CheckpointError

from .plain_checkpoint import MAX_DEPTH, TAG

__all__ = ['ForeignPickleError', 'check_structure', 'read_foreign_pickle']

_STORAGE_DTYPES = {
    f'torch.{name}Storage': dtype for name, dtype in [
        ('Float', torch.float32), ('Double', torch.float64), ('Half', torch.float16),
        ('BFloat16', torch.bfloat16), ('Long', torch.int64), ('Int', torch.int32),
        ('Short', torch.int16), ('Char', torch.int8), ('Byte', torch.uint8),
        ('Bool', torch.bool), ('ComplexFloat', torch.complex64),
        ('ComplexDouble', torch.complex128), ('Untyped', torch.uint8)]}
_NUMPY = [f'numpy.{core}.multiarray.{name}' for core in ('core', '_core')
          for name in ('_reconstruct', 'scalar')]
_KEY_TYPES = (str, int, float, bool, type(None))
_CONSTANTS = {'NONE': None, 'NEWTRUE': True, 'NEWFALSE': False}
_ATOM_OPS = {'INT', 'BININT', 'BININT1', 'BININT2', 'LONG',
             'LONG1', 'FLOAT', 'BINFLOAT', 'UNICODE', 'SHORT_BINUNICODE', 'BINUNICODE',
             'BINUNICODE8', 'SHORT_BINBYTES', 'BINBYTES', 'BINBYTES8'}


class ForeignPickleError(CheckpointError):
    """The pickle asks for something this reader does not do; ``what`` names it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Storage:
    """A storage of the archive, as a flat tensor of its dtype."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data


class _Global:
    """A global the file named: a name, never the object."""

    def __init__(self, name: str) -> None:
        self.name = name


def _python3_name(module: str, name: str) -> str:
    """``'module.name'`` as Python 3 reads a protocol-2 pickle (``__builtin__`` -> builtins)."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    return f'{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}'


def _ints(value: Any, what: str) -> tuple:
    if not (isinstance(value, tuple) and len(value) <= 32
            and all(type(n) is int and 0 <= n < 1 << 48 for n in value)):
        raise ForeignPickleError(f'a tensor {what} that is not a tuple of sizes')
    return value


class _Reader:
    """One pass over one pickle; ``storage`` reads the archive's record of a storage key."""

    def __init__(self, storage: Callable[[str, torch.dtype, int], torch.Tensor],
                 device: Optional[torch.device]) -> None:
        self.storage, self.device = storage, device
        self.storages: Dict[str, _Storage] = {}
        self.reducers: Dict[str, Callable] = {
            'torch._utils._rebuild_tensor_v2': self.tensor,
            'torch._utils._rebuild_tensor': self.tensor,
            'torch._utils._rebuild_parameter': self.parameter,
            'torch._utils._rebuild_parameter_with_state': self.parameter,
            'collections.OrderedDict': lambda *items: OrderedDict(*self.pairs(items)),
            'collections.Counter': self.counter,
            'torch.Size': lambda sizes=(): torch.Size(_ints(sizes, 'size')),
            '_codecs.encode': self.encode,
            'builtins.bytes': lambda *args: self.check(args == (), 'bytes() with arguments')
            or b'',
            'builtins.getattr': lambda *args: None,  # HistoryBuffer's statistics methods
            'numpy.dtype': self.dtype,
            **{name: self.array if name.endswith('_reconstruct') else self.scalar
               for name in _NUMPY}}
        self.classes = {'mmengine.logging.history_buffer.HistoryBuffer': 'HistoryBuffer',
                        'argparse.Namespace': 'Namespace'}
        self.markers = {'numpy.ndarray', *_STORAGE_DTYPES}

    @staticmethod
    def check(condition: bool, what: str) -> None:
        if not condition:
            raise ForeignPickleError(what)

    # -- the builders of REDUCE ---------------------------------------------------------
    def pairs(self, items: tuple) -> list:
        self.check(len(items) <= 1, 'OrderedDict with more than one argument')
        pairs = list(items[0]) if items else []
        self.check(all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], _KEY_TYPES)
                       for p in pairs), 'OrderedDict of anything but (key, value) pairs')
        return pairs

    def counter(self, counts: Any = None) -> dict:
        self.check(counts is None or type(counts) is dict and all(
            isinstance(k, _KEY_TYPES) for k in counts), 'Counter of anything but a dict')
        return {TAG: 'Counter', 'counts': counts or {}}

    def encode(self, text: Any = None, encoding: Any = None) -> bytes:
        self.check(isinstance(text, str) and encoding == 'latin1', '_codecs.encode of '
                   'anything but a latin-1 string')
        return codecs.encode(text, 'latin1')

    def tensor(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any =
               False, hooks: Any = None, metadata: Any = None) -> torch.Tensor:
        self.check(isinstance(storage, _Storage) and type(offset) is int
                   and offset >= 0 and isinstance(requires_grad, bool)
                   and (hooks is None or hooks == OrderedDict()) and not metadata,
                   'a tensor rebuilt from anything but a storage, sizes and strides')
        data = storage.data
        size, stride = _ints(size, 'size'), _ints(stride, 'stride')
        self.check(len(size) == len(stride), 'a tensor whose sizes and strides differ in length')
        extent = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
        self.check(0 in size or extent <= data.numel(), 'a tensor reaching past its storage')
        self.check(math.prod(size) <= max(data.numel(), 1),
                   'a tensor of more elements than its storage')
        tensor = data.as_strided(size, stride, offset)
        return tensor if self.device is None else tensor.to(self.device)

    def parameter(self, data: Any, requires_grad: Any = False, hooks: Any = None,
                  *state: Any) -> torch.Tensor:
        self.check(isinstance(data, torch.Tensor), 'a parameter of anything but a tensor')
        return data

    def dtype(self, code: Any = None, align: Any = False, copy: Any = True) -> dict:
        self.check(isinstance(code, str) and len(code) <= 4 and code.isalnum(),
                   f'numpy.dtype({code!r})')
        try:
            dtype = np.dtype(code)
        except TypeError:
            dtype = None
        self.check(dtype is not None and dtype.kind in 'biufc', f'numpy dtype {code!r} '
                   '(numbers only)')
        return {TAG: 'dtype', 'dtype': dtype.str}

    def array(self, cls: Any = None, shape: Any = None, tag: Any = None) -> dict:
        self.check(isinstance(cls, _Global) and cls.name == 'numpy.ndarray',
                   'numpy _reconstruct of anything but an ndarray')
        return {TAG: 'ndarray'}

    def scalar(self, dtype: Any = None, data: Any = None) -> dict:
        self.check(isinstance(dtype, dict) and dtype.get(TAG) == 'dtype'
                   and isinstance(data, bytes), 'numpy scalar of anything but a dtype and bytes')
        return {TAG: 'numpy_scalar', 'dtype': dtype['dtype'], 'shape': [], 'data': data}

    # -- BUILD ---------------------------------------------------------------------------
    def build(self, obj: Any, state: Any) -> None:
        kind = obj.get(TAG) if isinstance(obj, dict) else None
        if kind == 'dtype':  # (version, byte order, ...): numeric dtypes have no more
            self.check(isinstance(state, tuple) and len(state) == 8 and state[1] in '<>|='
                       and state[2:] == (None, None, None, -1, -1, 0), 'numpy dtype state')
            order = {'=': '<' if np.little_endian else '>'}.get(state[1], state[1])
            obj['dtype'] = np.dtype(obj['dtype']).newbyteorder(order).str
        elif kind == 'ndarray' and 'data' not in obj:  # (version, shape, dtype, fortran, data)
            self.check(isinstance(state, tuple) and len(state) == 5
                       and isinstance(state[2], dict) and state[2].get(TAG) == 'dtype'
                       and isinstance(state[3], bool) and isinstance(state[4], bytes),
                       'numpy array state (numbers only)')
            obj.update(dtype=state[2]['dtype'], shape=list(_ints(state[1], 'shape')),
                       data=state[4], fortran=state[3])
        elif kind == 'HistoryBuffer' and len(obj) == 1:
            self.check(isinstance(state, dict), 'HistoryBuffer state')
            obj.update(log_history=state.get('_log_history'),
                       count_history=state.get('_count_history'),
                       max_length=state.get('max_length'))
        elif kind == 'Namespace' and len(obj) == 1:
            self.check(isinstance(state, dict) and all(isinstance(k, str) for k in state),
                       'argparse.Namespace state')
            del obj[TAG]
            obj.update(state)
        elif type(obj) is OrderedDict and isinstance(state, dict) and set(state) <= {
                '_metadata'} and all(type(v) is OrderedDict for v in state.values()):
            obj.__dict__.update(state)  # a state dict's module versions, an instance attribute
        else:
            raise ForeignPickleError(f'BUILD on a {type(obj).__name__}')

    # -- the machine ---------------------------------------------------------------------
    def persistent(self, pid: Any) -> _Storage:
        self.check(isinstance(pid, tuple) and len(pid) == 5 and pid[0] == 'storage'
                   and isinstance(pid[1], _Global) and pid[1].name in _STORAGE_DTYPES
                   and isinstance(pid[2], str) and re.fullmatch(r'\w{1,64}', pid[2]) is not None
                   and type(pid[4]) is int and pid[4] >= 0, 'a persistent id that is no '
                   'torch storage')
        dtype = _STORAGE_DTYPES[pid[1].name]
        key = pid[2]
        if key not in self.storages:
            self.storages[key] = _Storage(self.storage(key, dtype, pid[4]))
        self.check(self.storages[key].data.dtype == dtype, 'one storage read as two dtypes')
        return self.storages[key]

    def load(self, data: bytes) -> Any:
        stack: List[Any] = []
        marks: List[int] = []
        memo: Dict[int, Any] = {}

        def pop_mark() -> list:
            self.check(bool(marks), 'an opcode that needs a MARK without one')
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            return items

        def top(kind: type) -> Any:
            kinds = (dict, OrderedDict) if kind is dict else (kind,)
            self.check(bool(stack) and type(stack[-1]) in kinds,
                       f'an item added to something that is no {kind.__name__}')
            return stack[-1]

        def set_items(target: dict, items: list) -> None:
            self.check(len(items) % 2 == 0 and all(
                isinstance(k, _KEY_TYPES) for k in items[::2]), 'a dict key that is no atom')
            target.update(zip(items[::2], items[1::2]))

        try:
            for opcode, arg, _ in pickletools.genops(data):
                op = opcode.name
                if op in _ATOM_OPS:
                    stack.append(arg)
                elif op in _CONSTANTS:
                    stack.append(_CONSTANTS[op])
                elif op in ('PROTO', 'FRAME'):
                    self.check(op == 'FRAME' or arg <= 5, f'pickle protocol {arg}')
                elif op == 'MARK':
                    marks.append(len(stack))
                elif op in ('EMPTY_DICT', 'EMPTY_LIST', 'EMPTY_TUPLE'):
                    stack.append({'EMPTY_DICT': {}, 'EMPTY_LIST': [], 'EMPTY_TUPLE': ()}[op])
                elif op in ('TUPLE1', 'TUPLE2', 'TUPLE3'):
                    n = int(op[-1])
                    self.check(len(stack) >= n, 'a tuple of missing items')
                    stack[-n:] = [tuple(stack[-n:])]
                elif op in ('TUPLE', 'LIST'):
                    stack.append((tuple if op == 'TUPLE' else list)(pop_mark()))
                elif op == 'DICT':
                    items = pop_mark()
                    stack.append({})
                    set_items(stack[-1], items)
                elif op == 'APPEND':
                    self.check(len(stack) >= 2, 'APPEND without a list')
                    value = stack.pop()
                    top(list).append(value)
                elif op == 'APPENDS':
                    items = pop_mark()
                    top(list).extend(items)
                elif op == 'SETITEM':
                    self.check(len(stack) >= 3, 'SETITEM without a dict')
                    value, key = stack.pop(), stack.pop()
                    set_items(top(dict), [key, value])
                elif op == 'SETITEMS':
                    items = pop_mark()
                    set_items(top(dict), items)
                elif op in ('PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE'):
                    self.check(bool(stack), 'a memo of nothing')
                    memo[len(memo) if op == 'MEMOIZE' else arg] = stack[-1]
                elif op in ('GET', 'BINGET', 'LONG_BINGET'):
                    self.check(arg in memo, 'a memo entry that was never stored')
                    stack.append(memo[arg])
                elif op in ('GLOBAL', 'STACK_GLOBAL'):
                    if op == 'STACK_GLOBAL':
                        self.check(len(stack) >= 2 and all(isinstance(s, str)
                                                           for s in stack[-2:]), 'STACK_GLOBAL')
                        module, name = stack.pop(-2), stack.pop()
                    else:
                        module, name = arg.split(' ', 1)
                    full = _python3_name(module, name)
                    self.check(full in self.reducers or full in self.classes
                               or full in self.markers, f'the global {full}')
                    stack.append(_Global(full))
                elif op == 'REDUCE':
                    self.check(len(stack) >= 2, 'REDUCE without a callable')
                    args, func = stack.pop(), stack.pop()
                    self.check(isinstance(func, _Global) and func.name in self.reducers
                               and isinstance(args, tuple), 'a call of '
                               + (func.name if isinstance(func, _Global) else 'a non-global'))
                    stack.append(self.reducers[func.name](*args))
                elif op == 'NEWOBJ':
                    self.check(len(stack) >= 2, 'NEWOBJ without a class')
                    args, cls = stack.pop(), stack.pop()
                    self.check(isinstance(cls, _Global) and cls.name in self.classes
                               and args == (), 'an object of '
                               + (cls.name if isinstance(cls, _Global) else 'a non-class'))
                    stack.append({TAG: self.classes[cls.name]})
                elif op == 'BUILD':
                    self.check(len(stack) >= 2, 'BUILD without an object')
                    state = stack.pop()
                    self.build(stack[-1], state)
                elif op == 'BINPERSID':
                    self.check(bool(stack), 'BINPERSID without an id')
                    stack.append(self.persistent(stack.pop()))
                elif op == 'POP':
                    self.check(bool(stack), 'POP of nothing')
                    stack.pop()
                elif op == 'STOP':
                    self.check(len(stack) == 1 and not marks, 'a pickle that ends unbalanced')
                    return stack[0]
                else:
                    raise ForeignPickleError(f'the opcode {op}')
        except ForeignPickleError:
            raise
        except (ValueError, TypeError) as error:  # genops on broken bytes; a builder's call
            raise ForeignPickleError(f'a malformed pickle ({error})') from None
        raise ForeignPickleError('a pickle without STOP')


def check_structure(data: bytes) -> None:
    """Refuse a pickle whose tuples nest deeper than :data:`MAX_DEPTH`, before any loader
    reads it: hashing such a tuple (as a dict key) recurses in C until the process crashes.
    Each opcode's stack effect comes from ``pickletools``; only tuples carry a depth."""
    stack: List[int] = []
    marks: List[int] = []
    memo: Dict[Any, int] = {}
    try:
        for opcode, arg, _ in pickletools.genops(data):
            op = opcode.name
            if op == 'MARK':
                marks.append(len(stack))
                continue
            if op == 'STOP':
                return
            popped: List[int] = []
            before = opcode.stack_before
            if pickletools.markobject in before:
                start = marks.pop() if marks else len(stack)
                popped, stack[start:] = stack[start:], []
                before = before[:before.index(pickletools.markobject)]
            if op in ('PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE'):
                memo[len(memo) if op == 'MEMOIZE' else arg] = stack[-1] if stack else 0
                continue
            if op in ('GET', 'BINGET', 'LONG_BINGET', 'DUP'):
                stack.append(memo.get(arg, 0) if op != 'DUP' else stack[-1] if stack else 0)
                continue
            count = len(before)
            popped += stack[len(stack) - count:] if count else []
            del stack[len(stack) - count:]
            depth = 1 + max(popped, default=0) if op.startswith('TUPLE') else 0
            if depth > MAX_DEPTH:
                raise CheckpointError(f'its pickle nests tuples more than {MAX_DEPTH} deep')
            stack.extend([depth] * len(opcode.stack_after))
    except CheckpointError:
        raise
    except ValueError:  # not a pickle: the loader that reads it says so
        return


def read_foreign_pickle(archive: zipfile.ZipFile, pickle_name: str, data: bytes,
                        device: Optional[torch.device] = None) -> Any:
    """The object in ``data``, the pickle ``pickle_name`` of a torch zip ``archive`` (checked
    by the caller: stored entries, bounded sizes, read once), as plain data and plain forms;
    tensors on ``device``."""
    prefix = pickle_name[:-len('data.pkl')]
    names = set(archive.namelist())

    def storage(key: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        record = f'{prefix}data/{key}'
        if record not in names:
            raise ForeignPickleError(f'a storage with no record ({record})')
        itemsize = torch.empty((), dtype=dtype).element_size()
        if archive.getinfo(record).file_size != numel * itemsize:
            raise ForeignPickleError(f'a storage whose record {record} is not {numel} '
                                     f'elements of {dtype}')
        return torch.frombuffer(bytearray(archive.read(record)), dtype=dtype) if numel else \
            torch.empty(0, dtype=dtype)

    return _Reader(storage, device).load(data)
