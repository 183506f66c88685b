"""Random number generator states in the checkpoint, so that a resumed run is exact."""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Saves the torch, CUDA, numpy and Python RNG states with every checkpoint and puts them
    back on resume.

    mmengine's checkpoints carry the seed but not the generators' states, so after a resume
    drop-path, the random masks and the data workers' seeds (each epoch's workers are seeded
    from torch's generator) follow a different stream than the uninterrupted run would have.
    The states are restored at ``before_train``, after everything the Runner does while
    resuming (it may re-seed), so the loop starts exactly where the checkpoint was taken.
    With ``persistent_workers=True`` the workers outlive epochs and their streams cannot be
    restored: use ``worker_init_fn=dict(type='worker_init_from_torch_seed')`` with
    ``persistent_workers=False`` for an exact resume (the configs here do).

    Every rank restores the states of rank 0, which saved the checkpoint; that matches a
    run whose ranks share one seed (mmengine's default, ``diff_rank_seed=False``).
    """

    priority = 'LOWEST'  # restore after every other hook's before_train

    def __init__(self) -> None:
        self._pending: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint['random_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not getattr(runner, '_resume', False):
            return  # load_from (fine-tuning, evaluation) starts its own random stream
        self._pending = checkpoint.get('random_state')
        if self._pending is None:
            runner.logger.warning('The checkpoint has no random_state: the resumed run will '
                                  'not repeat the random stream of the original run.')

    def before_train(self, runner) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        torch.set_rng_state(state['torch'])
        np.random.set_state(state['numpy'])
        random.setstate(state['python'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])
