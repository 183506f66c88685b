"""Every rank's random generator states in the checkpoint, for an exact resume, and a random
stream of its own on every rank."""
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.dist import gather_object, get_rank, get_world_size
from mmengine.hooks import CheckpointHook, Hook
from mmpretrain.registry import HOOKS

PER_RANK = 'per_rank'  # checkpoint['random_state'][PER_RANK][r] is rank r's state


def get_rng_state() -> dict:
    """The torch, CUDA (when in use), numpy and Python generator states of this process."""
    state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                 python=random.getstate())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Put back :func:`get_rng_state`'s states, as CPU bytes: ``Runner.resume`` may map them
    to a GPU, and the torch and CUDA setters take CPU byte tensors only."""
    torch.set_rng_state(_cpu_bytes(state['torch']))
    np.random.set_state(state['numpy'])
    random.setstate(state['python'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_cpu_bytes(s) for s in state['cuda']])


def _cpu_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(device='cpu', dtype=torch.uint8)


def seed_rank(seed: int, rank: int, iteration: int) -> None:
    """Seed torch (CUDA included), numpy and Python from ``(seed, rank, iteration)``.

    Hashed by ``SeedSequence``, as ``seed + rank`` would give rank 1 of seed 0 the stream of
    rank 0 of seed 1; the iteration keeps a resumed rank without its state from replaying.
    """
    words = np.random.SeedSequence([seed % 2**64, rank, iteration]).generate_state(3)
    torch.manual_seed(int(words[0]))
    np.random.seed(int(words[1]))
    random.seed(int(words[2]))


def _same_state(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    np_a, np_b = a['numpy'], b['numpy']
    return (torch.equal(a['torch'], b['torch']) and a['python'] == b['python']
            and np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1])
            and tuple(np_a[2:]) == tuple(np_b[2:])
            and all(torch.equal(x, y) for x, y in zip(a.get('cuda', ()), b.get('cuda', ()))))


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Gives every rank a random stream of its own and saves every rank's torch, CUDA, numpy
    and Python RNG states with each checkpoint; on resume each rank restores its own.

    mmengine seeds all ranks alike (``diff_rank_seed=False``) and saves no generator states,
    so ranks would repeat each other's randomness and a resumed run would not be exact.
    ``Runner.save_checkpoint`` runs on rank 0 only, so every rank sends its states to rank 0
    just before ``CheckpointHook`` saves (hence the priority). See docs/reliability.md.
    """

    priority = 80  # after ParamSchedulerHook (LOW), before CheckpointHook (VERY_LOW)

    def __init__(self) -> None:
        self._pending: Optional[dict] = None
        self._resumed = False
        self._gathered: Optional[List[dict]] = None
        self._gather_every_iter = False

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not getattr(runner, '_resume', False):
            return  # load_from (fine-tuning, evaluation) starts its own random stream
        self._resumed = True
        saved = checkpoint.get('random_state')
        if saved is None:
            runner.logger.warning('The checkpoint has no random_state: the resumed run will '
                                  'not repeat the random stream of the original run.')
            return
        rank, world_size = get_rank(), get_world_size()
        states = saved.get(PER_RANK, [saved])  # one state: written before per-rank states
        if PER_RANK not in saved and world_size > 1:
            runner.logger.warning(
                f'The checkpoint holds one random state (rank 0\'s; written before states '
                f'were saved per rank) but this run has {world_size} ranks: rank 0 restores '
                'it, the others start new random streams, and the resumed run will not '
                'repeat the original run exactly.')
        elif len(states) != world_size:
            runner.logger.warning(
                f'The checkpoint holds the random states of {len(states)} ranks but this '
                f'run has {world_size}: ranks without a saved state start new random '
                'streams, and the resumed run will not repeat the original run exactly.')
        elif any(state is None for state in states):
            missing = [r for r, state in enumerate(states) if state is None]
            runner.logger.warning(
                f'The checkpoint has no random state for ranks {missing} (it was saved '
                'outside CheckpointHook\'s schedule): they start new random streams, and '
                'the resumed run will not repeat the original run exactly.')
        self._pending = states[rank] if rank < len(states) else None

    def before_train(self, runner) -> None:
        # SafeCheckpointHook's rolling checkpoint may save by iterations on its own.
        self._gather_every_iter = any(
            isinstance(hook, CheckpointHook)
            and not (hook.by_epoch and getattr(hook, 'latest_by_epoch', True))
            for hook in runner.hooks)
        # Restored here, after the Runner's resume, which re-seeds.
        if self._pending is not None:
            state, self._pending = self._pending, None
            set_rng_state(state)
            return
        rank = get_rank()
        # A fresh run's rank 0 keeps its stream; a resume without its state must not replay it.
        if rank != 0 or self._resumed:
            seed_rank(runner.seed, rank, runner.iter)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if self._gather_every_iter:
            self._gather()

    def after_train_epoch(self, runner) -> None:
        self._gather()

    def _gather(self) -> None:
        # All ranks take part; only rank 0, which writes the checkpoint, receives the list.
        if get_world_size() > 1:
            self._gathered = gather_object(get_rng_state(), dst=0)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        rank, world_size = get_rank(), get_world_size()
        own = get_rng_state()
        states: List[Optional[dict]] = [None] * world_size
        if world_size > 1:
            # The gathered states are this save's only if this rank drew nothing since.
            if self._gathered is not None and _same_state(self._gathered[rank], own):
                states = list(self._gathered)
            else:
                runner.logger.warning(
                    'This checkpoint is saved at a point where the other ranks did not send '
                    'their random states (outside CheckpointHook\'s schedule): only rank '
                    f'{rank}\'s is stored, and a run resumed from it will not be exact.')
        states[rank] = own
        checkpoint['random_state'] = {PER_RANK: states}
