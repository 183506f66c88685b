"""Gloo process groups for CPU runs (the tests, a laptop), which mmengine cannot start."""
from unittest import mock

import torch
import torch.distributed as dist
from mmengine.dist import init_dist


def init_cpu_distributed(launcher: str) -> bool:
    """Start a gloo group for ``--launcher pytorch``/``slurm`` without CUDA; True if it did."""
    if launcher not in ('pytorch', 'slurm') or torch.cuda.is_available() or dist.is_initialized():
        return False
    # mmengine's launchers call torch.cuda.set_device, which fails without a GPU: skip only that.
    with mock.patch.object(torch.cuda, 'set_device', lambda device: None):
        init_dist(launcher, backend='gloo')
    return True
