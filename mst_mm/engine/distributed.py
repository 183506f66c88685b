"""Gloo process groups for the tools' ``--launcher`` on a machine without CUDA (a laptop, the
tests): mmengine's launchers select a CUDA device before they create the group."""
import os
import subprocess

import torch
import torch.distributed as dist


def init_cpu_distributed(launcher: str) -> bool:
    """Start a gloo group for ``--launcher pytorch``/``slurm`` without CUDA; True if it did.

    The group is made from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``); under Slurm they are first set from Slurm's, as mmengine's launcher
    sets them. The runner then finds the group and starts none of its own.
    """
    if launcher not in ('pytorch', 'slurm') or torch.cuda.is_available() or dist.is_initialized():
        return False
    if launcher == 'slurm':
        os.environ.setdefault('MASTER_PORT', '29500')  # torch.distributed's default port
        if 'MASTER_ADDR' not in os.environ:  # the first node of the job
            os.environ['MASTER_ADDR'] = subprocess.getoutput(
                f'scontrol show hostname {os.environ["SLURM_NODELIST"]} | head -n1')
        os.environ.update(WORLD_SIZE=os.environ['SLURM_NTASKS'], RANK=os.environ['SLURM_PROCID'],
                          LOCAL_RANK=os.environ.get('SLURM_LOCALID', '0'))
    dist.init_process_group('gloo')
    return True
