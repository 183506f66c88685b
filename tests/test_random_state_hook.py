"""RandomStateHook without a run: the saved generator states survive a weights-only load and
come back on resume only (the end-to-end check is in test_resume.py)."""
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mst_mm.engine import read_checkpoint
from mst_mm.engine.hooks import RandomStateHook


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


@pytest.mark.parametrize('saved_as', ['this version, mapped to a GPU', 'a list per rank'])
def test_the_saved_states_come_back_on_resume_and_not_on_load_from(saved_as, tmp_path):
    before = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        checkpoint = {}
        RandomStateHook().before_save_checkpoint(None, checkpoint)
        expected = draws()
        torch.save(checkpoint, tmp_path / 'ckpt.pth')
        loaded = read_checkpoint(str(tmp_path / 'ckpt.pth'))  # weights-only, as a resume
        state = loaded['random_state']
        if saved_as == 'a list per rank':   # what earlier versions saved: rank 0's first
            loaded['random_state'] = {'per_rank': [state, None]}
        else:
            state['torch'] = StateOnTheGPU(state['torch'])
        for resume in (False, True):
            hook = RandomStateHook()
            hook.after_load_checkpoint(SimpleNamespace(_resume=resume), loaded)
            hook.before_train(None)
            assert (draws() == expected) is resume
    finally:
        torch.set_rng_state(before[0])
        np.random.set_state(before[1])
        random.setstate(before[2])
