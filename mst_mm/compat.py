"""What mst_mm needs from torch that its oldest supported release, 2.1, lacks: each detected
by the feature, not by the version number, in this one module.

- A fused AdamW kernel for CPU parameters (2.4; CUDA has had one since 2.0).
- ``torch.amp.GradScaler(device)`` (2.3; before, ``torch.cuda.amp.GradScaler``, CUDA only).
- ``torch.nn.attention.sdpa_kernel`` (2.3; before, ``torch.backends.cuda.sdp_kernel``), for
  the benchmark's FLOP count and the GPU tests' backend comparison.

One is a fault rather than a missing feature, and can only be told by the version: torch
2.1's CPU flash-attention kernel corrupts memory in its bfloat16 backward (seen with 2.1.2:
"double free or corruption", then an abort, in a training step under CPU autocast; fine with
the math backend, and in torch 2.13; the releases between are untested).
"""
from contextlib import AbstractContextManager
from typing import Any

import torch

#: torch 2.1: a training step under CPU bfloat16 autocast may corrupt memory (see above).
CPU_BFLOAT16_BACKWARD_CORRUPTS = tuple(
    int(part) for part in torch.__version__.split('+')[0].split('.')[:2]) < (2, 2)


def fused_supported(optimizer: type, device: torch.device) -> bool:
    """Whether this torch has a fused kernel of ``optimizer`` (a ``torch.optim`` class) for
    parameters on ``device``'s type: torch refuses ``fused=True`` when the optimiser is
    built, so a one-element build tells."""
    try:
        optimizer([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def grad_scaler(device_type: str = 'cuda', **kwargs) -> Any:
    """torch's ``GradScaler`` for ``device_type``; before torch 2.3, CUDA's."""
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler(device_type, **kwargs)
    if device_type != 'cuda':
        raise RuntimeError(f'This torch ({torch.__version__}) has a GradScaler for CUDA only, '
                           f'not for {device_type!r}: use torch 2.3 or later.')
    return torch.cuda.amp.GradScaler(**kwargs)


def attention_backend(name: str) -> AbstractContextManager:
    """A block where ``scaled_dot_product_attention`` runs on the backend ``name`` alone
    (``'MATH'``, ``'FLASH_ATTENTION'``, ``'EFFICIENT_ATTENTION'``), raising where it cannot."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        return torch.backends.cuda.sdp_kernel(enable_math=name == 'MATH',
                                              enable_flash=name == 'FLASH_ATTENTION',
                                              enable_mem_efficient=name == 'EFFICIENT_ATTENTION')
    return sdpa_kernel([getattr(SDPBackend, name)])


def math_attention() -> AbstractContextManager:
    """A block where ``scaled_dot_product_attention`` runs on its math backend alone."""
    return attention_backend('MATH')
