"""Random number generator states in the checkpoint, so that a resumed run is exact, and a
random stream of its own on every rank."""
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
    """Put back states that :func:`get_rng_state` returned.

    The torch and CUDA setters take CPU byte tensors only, but ``Runner.resume`` loads
    checkpoints with a ``map_location`` (a GPU, by default on GPU machines) that moves every
    saved tensor, these states included: each is brought back to the CPU as bytes first.

    Args:
        state (dict): ``torch``, ``numpy``, ``python`` and optionally ``cuda`` states.
    """
    torch.set_rng_state(_cpu_bytes(state['torch']))
    np.random.set_state(state['numpy'])
    random.setstate(state['python'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_cpu_bytes(s) for s in state['cuda']])


def _cpu_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(device='cpu', dtype=torch.uint8)


def seed_rank(seed: int, rank: int, iteration: int) -> None:
    """Seed torch (CUDA included), numpy and Python from ``(seed, rank, iteration)``.

    numpy's ``SeedSequence`` hashes the three numbers, so that nearby seeds, ranks and
    iterations still give unrelated streams (``seed + rank`` would hand rank 1 of seed 0
    the stream of rank 0 of seed 1). The iteration keeps a rank whose state could not be
    restored on resume from replaying the stream it began the training with.

    Args:
        seed (int): The run's seed (``runner.seed``).
        rank (int): The process's rank.
        iteration (int): The iteration training starts from.
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
    """Gives every rank a random stream of its own, saves every rank's torch, CUDA, numpy and
    Python RNG states with each checkpoint and puts each rank's back on resume.

    Per-rank streams. mmengine seeds every rank alike (``diff_rank_seed=False``), so without
    this the crops, flips and jitter of data worker ``w``, the student's random masks and
    drop-path would be the same on every rank: N ranks would see one rank's randomness N
    times. mmengine's ``diff_rank_seed=True`` would give per-rank streams too (the Runner
    broadcasts rank 0's parameters and buffers after ``init_weights``, so the weights would
    still agree); the seeding lives here because this hook must restore or re-seed every
    rank on resume anyway. The ranks share the seed until the weights exist, and at
    ``before_train`` every rank but 0 re-seeds from ``(seed, rank, iteration)``. Rank 0
    keeps its stream so that a single-process run draws what it always drew. The samplers
    shuffle with their own generators, seeded alike on all ranks, and stay in step.

    Exact resume. mmengine's checkpoints carry the seed but not the generators' states, so
    after a resume drop-path, the masks and the data workers' seeds (each epoch's workers are
    seeded from torch's generator) would follow a different stream than the uninterrupted
    run. ``Runner.save_checkpoint`` runs on rank 0 only (``master_only``), so
    ``before_save_checkpoint`` cannot collect the other ranks' states: every rank sends its
    states to rank 0 at the end of each epoch (and of each iteration when a
    ``CheckpointHook`` saves by iterations), just before ``CheckpointHook`` saves - hence
    this hook's priority, between ``LOW`` and ``VERY_LOW`` - and the checkpoint stores one
    state per rank. On resume each rank restores its own at ``before_train``, after
    everything the Runner does while resuming (it re-seeds); only ``CheckpointHook``'s
    ``before_train``, which draws nothing, comes later. With ``persistent_workers=True`` the
    workers outlive epochs and their streams cannot be restored: use
    ``worker_init_fn=dict(type='worker_init_from_torch_seed')`` with
    ``persistent_workers=False`` for an exact resume (the configs here do).

    A checkpoint written before states were saved per rank holds rank 0's only, and a run
    resumed on a different number of ranks finds too few or too many: the ranks without a
    state of their own start new streams, with a warning that the resumed run is not exact.
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
        if self._pending is not None:
            state, self._pending = self._pending, None
            set_rng_state(state)
            return
        rank = get_rank()
        # Rank 0 of a fresh run keeps the stream it was seeded with; on a resume without its
        # saved state it must not replay the original run's stream from iteration 0 either.
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
