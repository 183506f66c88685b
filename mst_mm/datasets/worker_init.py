"""A data-loader worker seeding that changes every epoch, differs per rank and survives a
resume."""
import os
import random

import numpy as np
import torch
from mmengine.dist import get_rank, is_distributed
from mmengine.registry import FUNCTIONS


def _current_rank() -> int:
    # A spawned worker has no process group (a forked one does): fall back to the launcher's.
    return get_rank() if is_distributed() else int(os.environ.get('RANK', 0))


def worker_seed(base_seed: int, rank: int) -> int:
    """The seed in ``[0, 2**64)`` of a worker whose ``torch.initial_seed()`` is ``base_seed``.

    Rank 0 keeps ``base_seed`` (single-process runs draw what they drew before); other ranks
    hash ``(base_seed, rank)``, as ``base_seed + rank`` would collide across workers.
    """
    if rank == 0:
        return base_seed
    entropy = np.random.SeedSequence([base_seed % 2**64, rank])
    return int(entropy.generate_state(1, dtype=np.uint64)[0])


@FUNCTIONS.register_module()
def worker_init_from_torch_seed(worker_id: int) -> None:
    """Seed torch, numpy and ``random`` in a worker from torch's seed for it and the rank.

    Unlike mmengine's ``seed + worker_id``, this differs every epoch, differs per rank and
    repeats exactly on resume (see docs/reliability.md).

    Args:
        worker_id (int): Unused: torch already folded it into the seed.
    """
    rank = _current_rank()
    seed = worker_seed(torch.initial_seed(), rank)
    if rank != 0:
        torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed % 2**32)
