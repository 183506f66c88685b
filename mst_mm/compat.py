"""What mst_mm needs from torch that its oldest supported release, 2.1, lacks: each detected
by the feature, not by the version number, in this one module.

- A fused AdamW kernel for CPU parameters (2.4; CUDA has had one since 2.0).

One is a fault rather than a missing feature, and can only be told by the version: torch
2.1's CPU flash-attention kernel corrupts memory in its bfloat16 backward (seen with 2.1.2:
"double free or corruption", then an abort, in a training step under CPU autocast; fine with
the math backend, and in torch 2.13; the releases between are untested).
"""
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
