"""RandomStateHook without a run: the saved generator states survive a weights-only load and
come back on resume only (the end-to-end check is in test_resume.py)."""
import random
from types import SimpleNamespace

import numpy as np
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
