"""A data-loader worker seeding that changes every epoch, differs per rank and survives a
resume."""
import os
import random

import numpy as np
import torch
from mmengine.dist import get_rank, is_distributed
from mmengine.registry import FUNCTIONS


def _current_rank() -> int:
    # A forked worker inherits its parent's process group, so get_rank() answers there; a
    # spawned one has none, and the launcher's RANK variable (torchrun, mmengine's slurm/mpi
    # set-up) is what is left.
    return get_rank() if is_distributed() else int(os.environ.get('RANK', 0))


def worker_seed(base_seed: int, rank: int) -> int:
    """The seed of a data-loader worker whose torch seed is ``base_seed``, on ``rank``.

    Rank 0 keeps ``base_seed``, so that a single-process run (and the checkpoints it wrote)
    draws exactly what it drew before ranks were folded in. Other ranks hash
    ``(base_seed, rank)`` with numpy's ``SeedSequence``: ``base_seed + rank`` would make
    worker 1 on rank 0 and worker 0 on rank 1 collide.

    Args:
        base_seed (int): ``torch.initial_seed()`` in the worker (torch's per-epoch base seed
            plus the worker id).
        rank (int): The process's rank in the distributed group.

    Returns:
        int: A seed in ``[0, 2**64)``.
    """
    if rank == 0:
        return base_seed
    entropy = np.random.SeedSequence([base_seed % 2**64, rank])
    return int(entropy.generate_state(1, dtype=np.uint64)[0])


@FUNCTIONS.register_module()
def worker_init_from_torch_seed(worker_id: int) -> None:
    """Seed torch, numpy and ``random`` in a worker from torch's seed for it and the rank.

    mmengine's default ``worker_init_fn`` seeds every worker with ``seed + worker_id``: with
    non-persistent workers each epoch then repeats the previous epoch's augmentation
    randomness, and with persistent ones a resumed run cannot repeat the original's. torch
    seeds each worker with a base seed drawn from the main process's generator when the
    epoch's iterator is created, plus the worker id; deriving the seeds from it makes every
    epoch different and, with ``RandomStateHook`` restoring the main generator, the resumed
    epochs identical to the uninterrupted run's.

    The rank is folded in as well (torch's generator included, which some transforms use):
    the main generators of all ranks start from one seed, so without it worker ``w`` of
    every rank would draw the same crops, flips and colour jitter whenever the main
    generators coincide. ``RandomStateHook`` also separates the ranks' main generators;
    this keeps the workers apart even where that hook is not used.

    Args:
        worker_id (int): The worker's index (torch already folded it into the seed).
    """
    rank = _current_rank()
    seed = worker_seed(torch.initial_seed(), rank)
    if rank != 0:
        torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed % 2**32)
