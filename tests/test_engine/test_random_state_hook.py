"""RandomStateHook without a run: the saved generator states survive a weights-only load and
come back on resume only (the end-to-end check is in test_resume.py).

It keeps the CUDA generator of this process's own GPU only, checked on the CPU with
torch.cuda's functions replaced: reading every visible GPU's state would create a CUDA
context on each of them, from every rank."""
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mst_mm.engine import read_checkpoint
from mst_mm.engine.hooks import RandomStateHook
from mst_mm.engine.plain_checkpoint import to_plain


def draws() -> tuple:
    return (int(torch.randint(0, 2**31, ())), int(np.random.randint(2**31)),
            random.randrange(2**31))


class StateOnTheGPU:
    """A saved state as ``Runner.resume`` hands it over on a GPU machine (its map_location
    moved every tensor to the GPU): torch's setter refuses it; ``.cpu()`` gives the bytes."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def cpu(self) -> torch.Tensor:
        return self.tensor


def test_the_saved_states_come_back_on_resume_and_not_on_load_from(tmp_path):
    before = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        checkpoint = {}
        RandomStateHook().before_save_checkpoint(None, checkpoint)
        expected = draws()
        torch.save(to_plain(checkpoint), tmp_path / 'ckpt.pth')  # as CheckedRunner saves
        torch.load(tmp_path / 'ckpt.pth', weights_only=True)  # torch's own loader reads it
        loaded = read_checkpoint(str(tmp_path / 'ckpt.pth'))  # as a resume reads it
        loaded['random_state']['torch'] = StateOnTheGPU(loaded['random_state']['torch'])
        for resume in (False, True):
            hook = RandomStateHook()
            hook.after_load_checkpoint(SimpleNamespace(_resume=resume), loaded)
            hook.before_train(None)
            assert (draws() == expected) is resume
    finally:
        torch.set_rng_state(before[0])
        np.random.set_state(before[1])
        random.setstate(before[2])


CURRENT = 1  # this rank's GPU, of three visible


@pytest.fixture
def gpus(monkeypatch):
    """Three fake GPUs whose generator states are distinct byte tensors; what was read from
    and written to which device."""
    states = {i: torch.full((16, ), i, dtype=torch.uint8) for i in range(3)}
    calls = SimpleNamespace(read=[], written=[])

    def get_rng_state(device='cuda'):
        calls.read.append(device)
        return states[device].clone()

    def every_gpu():
        raise AssertionError('get_rng_state_all touches every visible GPU')

    cuda = torch.cuda
    monkeypatch.setattr(cuda, 'is_available', lambda: True)
    monkeypatch.setattr(cuda, 'is_initialized', lambda: True)
    monkeypatch.setattr(cuda, 'current_device', lambda: CURRENT)
    monkeypatch.setattr(cuda, 'get_rng_state', get_rng_state)
    monkeypatch.setattr(cuda, 'get_rng_state_all', every_gpu)
    monkeypatch.setattr(cuda, 'set_rng_state',
                        lambda state, device='cuda': calls.written.append((device, state)))
    monkeypatch.setattr(cuda, 'set_rng_state_all', every_gpu)
    before = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    yield states, calls
    torch.set_rng_state(before[0])
    np.random.set_state(before[1])
    random.setstate(before[2])


def resume(checkpoint: dict) -> None:
    hook = RandomStateHook()
    hook.after_load_checkpoint(SimpleNamespace(_resume=True), checkpoint)
    hook.before_train(None)


def test_the_current_gpus_state_is_saved_and_put_back_on_it(gpus):
    states, calls = gpus
    checkpoint = {}
    RandomStateHook().before_save_checkpoint(None, checkpoint)
    assert calls.read == [CURRENT]
    assert torch.equal(checkpoint['random_state']['cuda'], states[CURRENT])
    resume(checkpoint)
    [(device, state)] = calls.written
    assert device == CURRENT and torch.equal(state, states[CURRENT])
