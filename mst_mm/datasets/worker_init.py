"""A data-loader worker seeding that changes every epoch and survives a resume."""
import random

import numpy as np
import torch
from mmengine.registry import FUNCTIONS


@FUNCTIONS.register_module()
def worker_init_from_torch_seed(worker_id: int) -> None:
    """Seed numpy and ``random`` in a worker from the seed torch gave that worker.

    mmengine's default ``worker_init_fn`` seeds every worker with ``seed + worker_id``: with
    non-persistent workers each epoch then repeats the previous epoch's augmentation
    randomness, and with persistent ones a resumed run cannot repeat the original's. torch
    seeds each worker with a base seed drawn from the main process's generator when the
    epoch's iterator is created, plus the worker id; deriving numpy's and Python's seeds
    from it makes every epoch different and, with ``RandomStateHook`` restoring the main
    generator, the resumed epochs identical to the uninterrupted run's.

    Args:
        worker_id (int): The worker's index (torch already folded it into the seed).
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
