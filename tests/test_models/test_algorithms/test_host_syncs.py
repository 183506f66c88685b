"""No host synchronisation in the training step but the check of a finite loss.

When Python reads a tensor's value (``.item()``, ``if tensor:``, ``float(tensor)``, ...) or
calls an operation whose output size depends on the values (``nonzero``, boolean-mask
indexing, ``unique``, ...), the host waits until the GPU has run everything queued before
it, and the GPU then idles until the host queues more: every such read in a step costs a
stall. On a GPU, ``torch.cuda.set_sync_debug_mode('warn')`` reports them as they happen, but
only for CUDA tensors; here :class:`HostReads` records them on the CPU, where every tensor
stands for the device one it would be, with the place in the code that caused each.
"""
import functools
import inspect
import os
import sys
from typing import List, Tuple

import pytest
import torch
from mmengine.config import Config
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mst_mm.compat import fused_supported
from mst_mm.models.heads import DINODistillHead
from mst_mm.models.utils import FusedCosineEMA
from tests.helpers import DEMO_CONFIG, REPO, model_for_training, random_views

TORCH_DIR = os.path.dirname(torch.__file__)

# Operations that read values on the host (`_local_scalar_dense` is what item(), bool(),
# float(), int() and __index__ of a tensor run) or size their output by the values.
VALUE_READS = {'aten._local_scalar_dense', 'aten.nonzero', 'aten.masked_select',
               'aten._unique2', 'aten.unique_dim', 'aten.unique_consecutive', 'aten.equal',
               'aten.bincount'}
MASK_INDEXING = {'aten.index', 'aten.index_put', 'aten.index_put_'}
# Methods that copy a tensor to the host without an operation that the dispatcher sees
# (`.to('cpu')` is not counted: on the CPU it cannot be told from a move to the model's
# device). allclose reads its result inside its own kernel.
HOST_COPIES = {'tolist', 'numpy', 'cpu', 'allclose'}
# one_hot checks its values on the host on the CPU only (on CUDA a device-side assert).
CPU_ONLY_CHECKS = {'one_hot'}

THE_FINITE_LOSS_CHECK = ('aten._local_scalar_dense', 'mst_mm/models/algorithms/mst.py',
                         'parse_losses')


@functools.lru_cache(maxsize=None)
def _source_lines(counter: type) -> range:
    lines, first = inspect.getsourcelines(counter)
    return range(first, first + len(lines))


def _where(frame, counter: type) -> Tuple[str, str]:
    """``(file, function)`` of the innermost frame outside torch and ``counter``'s own code:
    the repository's path, or a package's below site-packages."""
    # counter's code, nested classes included, is what starts within its source lines
    # (Python 3.10 has no co_qualname).
    while (frame.f_code.co_filename.startswith(TORCH_DIR)
           or (frame.f_code.co_filename == __file__
               and frame.f_code.co_firstlineno in _source_lines(counter))):
        frame = frame.f_back
    path = frame.f_code.co_filename
    for root in (str(REPO) + os.sep, os.sep + 'site-packages' + os.sep):
        path = path.split(root, 1)[-1]
    return path, frame.f_code.co_name


class HostReads:
    """Context manager that records ``(operation, file, function)`` of every host read of
    tensor values in its block: ``file`` and ``function`` are the innermost Python frame
    outside torch (the repository's or a package's path)."""

    def __init__(self) -> None:
        self.reads: List[Tuple[str, str, str]] = []
        self._cpu_only_depth = 0
        outer = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, '__name__', '')
                if name in HOST_COPIES:
                    outer._record(name)
                outer._cpu_only_depth += name in CPU_ONLY_CHECKS
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    outer._cpu_only_depth -= name in CPU_ONLY_CHECKS

        class Operations(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = func.overloadpacket._qualified_op_name.replace('::', '.')
                if outer._cpu_only_depth == 0 and outer._reads_values(name, args, kwargs):
                    outer._record(name)
                return func(*args, **kwargs)

        self._modes = (Functions(), Operations())

    @staticmethod
    def _reads_values(name: str, args: tuple, kwargs: dict) -> bool:
        if name in VALUE_READS:
            return True
        if name == 'aten.repeat_interleave':  # tensor repeats (int ones reach no kernel)
            return kwargs.get('output_size') is None  # else sized by the repeats' sum
        if name in MASK_INDEXING:  # a boolean index runs nonzero, forward and backward
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                       for i in args[1] if i is not None)
        return False

    def _record(self, name: str) -> None:
        self.reads.append((name, *_where(sys._getframe(1), HostReads)))

    def __enter__(self) -> 'HostReads':
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


x = torch.linspace(-1, 1, 5)

PLANTED = {
    'item': lambda: x[0].item(),
    'if tensor': lambda: 1 if x.sum() > 0 else 0,
    'float': lambda: float(x.sum()),
    'int': lambda: int(x.sum()),
    'index': lambda: list(range(5))[x.argmax()],
    'tolist': lambda: x.tolist(),
    'numpy': lambda: x.numpy(),
    'cpu': lambda: x.cpu(),
    'nonzero': lambda: x.nonzero(),
    'torch.where(cond)': lambda: torch.where(x > 0),
    'boolean mask': lambda: x[x > 0],
    'boolean mask assignment': lambda: x.clone().__setitem__(x > 0, 0.0),
    'masked_select': lambda: x.masked_select(x > 0),
    'unique': lambda: x.unique(),
    'repeat_interleave by a tensor': lambda: x.repeat_interleave(torch.ones(5, dtype=int)),
    'equal': lambda: torch.equal(x, x),
    'allclose': lambda: torch.allclose(x, x),
}
# The same work without a read.
UNREAD = {
    'integer index': lambda: x[torch.tensor([0, 2])],
    'torch.where(cond, a, b)': lambda: torch.where(x > 0, x, 0.0),
    'repeat_interleave with output_size':
        lambda: x.repeat_interleave(torch.ones(5, dtype=int), output_size=5),
    'repeat_interleave by an int': lambda: x.repeat_interleave(2),
    'a reduction': lambda: (x > 0).any(),
    'one_hot on the CPU': lambda: torch.nn.functional.one_hot(torch.arange(3), 3),
}


@pytest.mark.parametrize('read', list(PLANTED))
def test_each_kind_of_host_read_is_seen_where_it_is(read):
    with HostReads() as counter:
        PLANTED[read]()
    assert counter.reads, read
    assert {(path, function) for _, path, function in counter.reads} == {
        ('tests/test_models/test_algorithms/test_host_syncs.py', '<lambda>')}


@pytest.mark.parametrize('work', list(UNREAD))
def test_work_without_a_read_is_not_counted(work):
    with HostReads() as counter:
        UNREAD[work]()
    assert counter.reads == []


def test_a_read_in_the_backward_pass_is_seen():
    w = torch.ones(5, requires_grad=True)
    loss = (w * x)[x > 0].sum()
    with HostReads() as counter:
        loss.backward()
    assert [name for name, _, _ in counter.reads] == ['aten.index_put']


@pytest.mark.parametrize('steps', [1, 2])
def test_a_training_step_reads_the_device_only_for_the_finite_loss_check(steps,
                                                                          message_hub):
    """The demo config's step, DeiT-S's in small: the data preprocessor's batched views,
    teacher, mask, student, losses, backward, per-parameter clipping and fused AdamW. The
    first step (the teacher's copy) and a later one (its EMA)."""
    cfg = Config.fromfile(DEMO_CONFIG)
    model, optim_wrapper = model_for_training(cfg)
    batch = random_views(cfg, batch_size=4)
    for _ in range(steps - 1):
        model.train_step(batch, optim_wrapper)
    with HostReads() as counter:
        model.train_step(batch, optim_wrapper)
    reads = counter.reads
    if not fused_supported(torch.optim.AdamW, torch.device('cpu')):
        # torch < 2.4 has no fused AdamW for the CPU, and its foreach AdamW reads every
        # parameter's step count there (inside torch, under mmengine's `step`); on a GPU the
        # recipe's fused AdamW runs, which reads nothing.
        optimiser = ('mmengine/optim/optimizer/optimizer_wrapper.py', 'step')
        assert any(read[1:] == optimiser for read in reads)
        reads = [read for read in reads if read[1:] != optimiser]
    # `if not torch.isfinite(total)`: the one wanted read, before the update.
    assert reads == [THE_FINITE_LOSS_CHECK]
    assert optim_wrapper.pop_grad_stats()  # the clipping ran, its statistics unread


def test_the_dino_loss_picks_its_pairs_without_a_mask_and_gives_the_same_bits():
    """The pairs j != i by position, against boolean-mask indexing (the plain form): the
    same loss and the same gradients, bit for bit."""
    torch.manual_seed(0)
    global_crops, crops, batch, prototypes = 2, 6, 3, 16
    student = torch.randn(crops * batch, prototypes, requires_grad=True)
    teacher = torch.randn(global_crops * batch, prototypes)
    head = DINODistillHead(prototypes)
    with HostReads() as counter:
        loss = head.loss(student, teacher)
        loss.backward()
    assert counter.reads == []

    reference = student.detach().clone().requires_grad_()
    teacher_p = torch.softmax(teacher / head.teacher_temp, dim=-1)  # the centre was 0
    student_logp = torch.log_softmax(reference / head.student_temp, dim=-1)
    pair_sums = -torch.mm(teacher_p.reshape(global_crops, -1),
                          student_logp.reshape(crops, -1).t())
    other_view = ~torch.eye(global_crops, crops, dtype=torch.bool)
    expected = pair_sums[other_view].sum() / (batch * (global_crops * crops - global_crops))
    expected.backward()
    assert torch.equal(loss, expected)
    assert torch.equal(student.grad, reference.grad)


def test_the_teacher_counts_its_updates_on_the_host_and_a_load_sets_the_count(message_hub):
    """FusedCosineEMA picks the momentum from a Python count, not the ``steps`` buffer; a
    loaded state dict (a resume) sets the count from the buffer."""
    student = torch.nn.Linear(3, 2)
    trained = FusedCosineEMA(torch.nn.Linear(3, 2), momentum=0.1)
    for _ in range(3):
        trained.update_parameters(student)
    resumed = FusedCosineEMA(torch.nn.Linear(3, 2), momentum=0.1)
    resumed.load_state_dict(trained.state_dict())
    momenta = []
    resumed.momentum_at = lambda steps: momenta.append(steps) or 0.1
    with HostReads() as counter:
        resumed.update_parameters(student)
    assert counter.reads == []
    assert momenta == [3] and int(resumed.steps) == 4


class PythonDataTensors:
    """Context manager that records ``(what, file, function)`` of every tensor built from
    Python data in its block (``torch.tensor``, ``torch.as_tensor`` and ``Tensor.new_tensor``
    of anything but a tensor) and of every index with a Python list (``x[:, [2, 1, 0]]``).
    On a GPU each is a copy from the host, which waits for the stream: a synchronisation
    that a CPU, with no copy, never shows."""

    FACTORIES = {'tensor', 'as_tensor', 'new_tensor'}

    def __init__(self) -> None:
        self.made: List[Tuple[str, str, str]] = []
        outer = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, '__name__', '')
                data = args[1] if name == 'new_tensor' else (args[0] if args else None)
                if name in outer.FACTORIES and not isinstance(data, torch.Tensor):
                    outer._record(name)
                elif name == '__getitem__' and _holds_a_list(args[1]):
                    outer._record('list index')
                return func(*args, **(kwargs or {}))

        self._mode = Functions()

    def _record(self, what: str) -> None:
        self.made.append((what, *_where(sys._getframe(1), PythonDataTensors)))

    def __enter__(self) -> 'PythonDataTensors':
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


def _holds_a_list(index) -> bool:
    return isinstance(index, list) or (isinstance(index, tuple)
                                       and any(isinstance(i, list) for i in index))


FROM_PYTHON = {
    'torch.tensor': lambda: torch.tensor([5.0, 3.0, 1.0]),
    'torch.as_tensor': lambda: torch.as_tensor([0, 1]),
    'new_tensor': lambda: x.new_tensor([[0, 0, 1], [1, 0, 0]]),
    'scalar tensor': lambda: torch.tensor(0.5),
    'list index': lambda: x.view(5, 1)[[4, 2, 0]],
    'list index in a tuple': lambda: x.view(1, 5)[:, [2, 1, 0]],
}
NOT_FROM_PYTHON = {
    'arange': lambda: torch.arange(5.0, 0.0, -2.0),
    'full': lambda: torch.full((3, ), 0.5),
    'flip': lambda: x.view(1, 5).flip(1),
    'as_tensor of a tensor': lambda: torch.as_tensor(x),
    'tensor index': lambda: x[x.argsort()],
    'slice': lambda: x[1:3],
}


@pytest.mark.parametrize('planted', list(FROM_PYTHON))
def test_a_tensor_from_python_data_is_seen_where_it_is_made(planted):
    with PythonDataTensors() as counter:
        FROM_PYTHON[planted]()
    assert [(path, function) for _, path, function in counter.made] == [
        ('tests/test_models/test_algorithms/test_host_syncs.py', '<lambda>')]


@pytest.mark.parametrize('work', list(NOT_FROM_PYTHON))
def test_tensors_made_on_the_device_are_not_counted(work):
    with PythonDataTensors() as counter:
        NOT_FROM_PYTHON[work]()
    assert counter.made == []


@pytest.fixture(scope='module')
def deit_s_step():
    """DeiT-S's model and optimiser wrapper with the config's own data preprocessor
    (BatchViewAugment on the workers' 224- and 96-px views), after one step (the teacher's
    copy, the optimiser's state), and a batch of 2 images."""
    from mmengine.logging import MessageHub
    cfg = Config.fromfile(str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'))
    MessageHub.get_instance('deit-s-step').update_info('max_iters', 100)
    model, optim_wrapper = model_for_training(cfg)
    batch = random_views(cfg, batch_size=2)
    batch['inputs'] = [view.to(torch.uint8) for view in batch['inputs']]  # as the workers
    model.train_step(batch, optim_wrapper)
    return model, optim_wrapper, batch


def test_a_deit_s_training_step_makes_no_tensor_from_python_data(deit_s_step):
    """The whole step: views, teacher, mask, student, decoder, losses, backward, clipping,
    AdamW and the EMA teacher."""
    model, optim_wrapper, batch = deit_s_step
    with PythonDataTensors() as counter:
        model.train_step(batch, optim_wrapper)
    assert counter.made == []


def test_the_step_check_fails_on_a_planted_tensor(deit_s_step, monkeypatch):
    """The same step with the decoder's upsampling taps built from a list again, and
    mmpretrain's channel swap by list index: both are found, each once per call."""
    from mmpretrain.models import SelfSupDataPreprocessor

    from mst_mm.models.heads import decoder_head
    model, optim_wrapper, batch = deit_s_step

    def planted_upsample(x, weight, bias=None):
        taps = weight.new_tensor([[0, 0, 1], [0, 1, 1], [1, 1, 0], [1, 0, 0]])
        kernel = taps @ weight @ taps.T
        return torch.nn.functional.conv_transpose2d(x, kernel.transpose(0, 1), bias,
                                                    stride=2, padding=1)

    monkeypatch.setattr(decoder_head, 'upsample2x_conv3x3', planted_upsample)
    monkeypatch.setattr(type(model.data_preprocessor), '_normalise',
                        lambda self, v: SelfSupDataPreprocessor.forward(
                            self, dict(inputs=v, data_samples=None))['inputs'])
    with PythonDataTensors() as counter:
        model.train_step(batch, optim_wrapper)
    stages = len(model.decoder_head.channels)  # one 2x upsampling per stage
    this_file = 'tests/test_models/test_algorithms/test_host_syncs.py'
    assert counter.made.count(('new_tensor', this_file, 'planted_upsample')) == stages > 0
    swaps = [made for made in counter.made if made[0] == 'list index']
    assert len(swaps) == len(batch['inputs'])
    assert {path for _, path, _ in swaps} == {'mmpretrain/models/utils/data_preprocessor.py'}
