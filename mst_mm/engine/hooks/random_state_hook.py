"""The saving process's random generator states in every checkpoint, put back on resume."""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Saves the torch, CUDA, numpy and Python generator states with each checkpoint (rank 0
    saves) and restores them on resume, where mmengine re-seeds (docs/reliability.md).

    The CUDA state is this process's own device's (``torch.cuda.current_device()``): each
    rank draws on its own GPU only. The checkpoint stores the numpy state's key array in
    plain form (``plain_checkpoint``), so torch's weights-only loader reads it."""
    priority = 'LOWEST'  # restore after every other hook's before_train

    def __init__(self) -> None:
        self._resumed_state: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # get_rng_state_all() would create a context on every visible GPU of the node.
            state['cuda'] = torch.cuda.get_rng_state(torch.cuda.current_device())
        checkpoint['random_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        # load_from (fine-tuning, evaluation) starts a random stream of its own.
        if getattr(runner, '_resume', False) and is_main_process():
            self._resumed_state = checkpoint.get('random_state')

    def before_train(self, runner) -> None:
        state, self._resumed_state = self._resumed_state, None
        if state is None:
            return
        # Runner.resume may have mapped the states to a GPU; the setters take CPU bytes.
        torch.set_rng_state(state['torch'].cpu())
        # A loader with persistent workers builds its iterator once, at its first epoch, and
        # that draws the workers' base seed from the torch generator (torch's
        # _BaseDataLoaderIter.__init__). The uninterrupted run drew it in epoch 1, before the
        # saved state; the resumed run builds a new one at its first epoch and would draw it
        # again, shifting every later mask and view. Let that draw come from a copy of the
        # stream instead, so the main stream goes on unshifted (the workers get a base seed
        # of their own, as resumed workers always do; a persistent loader reads
        # ``generator`` only then).
        loader = getattr(runner, 'train_dataloader', None)
        if (getattr(loader, 'persistent_workers', False) and loader.num_workers > 0
                and loader.generator is None):
            loader.generator = torch.Generator()
            loader.generator.set_state(torch.get_rng_state())
        np.random.set_state(state['numpy'])
        random.setstate(state['python'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state['cuda'].cpu(), torch.cuda.current_device())
