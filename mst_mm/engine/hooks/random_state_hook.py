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
    saves) and restores them on resume, where mmengine re-seeds (docs/reliability.md)."""
    priority = 'LOWEST'  # restore after every other hook's before_train

    def __init__(self) -> None:
        self._resumed_state: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint['random_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        # load_from (fine-tuning, evaluation) starts a random stream of its own.
        if getattr(runner, '_resume', False) and is_main_process():
            self._resumed_state = checkpoint.get('random_state')

    def before_train(self, runner) -> None:
        state, self._resumed_state = self._resumed_state, None
        if state is None:
            return
        state = state.get('per_rank', [state])[0]  # earlier versions saved a list per rank
        # Runner.resume may have mapped the states to a GPU; the setters take CPU bytes.
        torch.set_rng_state(state['torch'].cpu())
        np.random.set_state(state['numpy'])
        random.setstate(state['python'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state['cuda']])
