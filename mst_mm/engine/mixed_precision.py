"""Mixed precision by default on GPUs: ``optim_wrapper.mixed_precision`` picks the wrapper.

mmengine turns mixed precision on only through the wrapper's type (``AmpOptimWrapper``, or
``--amp``), so a config cannot ask for "mixed precision where there is a GPU"; this does.
"""
import logging
from typing import Tuple

import torch
from mmengine.logging import print_log

from ..compat import CPU_BFLOAT16_BACKWARD_CORRUPTS
from .optimizers import AMP_OPTIM_WRAPPERS

MIXED_PRECISION = ('auto', 'bfloat16', 'float16', None)


def resolve_mixed_precision(optim_wrapper_cfg: dict) -> dict:
    """The wrapper config that ``optim_wrapper_cfg['mixed_precision']`` asks for, without it.

    - ``'auto'``: on a CUDA GPU, bfloat16 where the GPU runs it natively (compute capability
      8.0 or higher: A100, H100, L4, RTX 30xx and later; no loss scaling, so no host
      synchronisation in the step), else float16 with dynamic loss scaling (as DINO's
      ``--use_fp16``): V100, T4 and RTX 20xx have no bfloat16 tensor cores, and
      ``torch.cuda.is_bf16_supported()`` says True where bfloat16 is only emulated. Without
      CUDA, float32 (CPU runs are unchanged).
    - ``'bfloat16'`` or ``'float16'``: that type, as above, on any device.
    - ``None`` (or the key absent): float32; on a GPU with TF32 matrix products.

    A wrapper that is mixed precision already (``--amp``, ``AmpOptimWrapper``) is kept.
    """
    cfg = dict(optim_wrapper_cfg)
    choice = cfg.pop('mixed_precision', None)
    if choice not in MIXED_PRECISION:
        raise ValueError(f'optim_wrapper.mixed_precision must be one of {MIXED_PRECISION}, got '
                         f'{choice!r}: use None for float32.')
    wrapper = cfg.get('type', 'OptimWrapper')
    if AMP_OPTIM_WRAPPERS.get(wrapper) == wrapper:  # mixed precision already
        return cfg
    on_gpu = torch.cuda.is_available()
    reason = 'optim_wrapper.mixed_precision'
    if choice == 'auto':
        choice, reason = auto_precision() if on_gpu else (None, 'no CUDA GPU')
    if choice is None:
        if on_gpu:
            # float32 runs its matrix products on TF32 tensor cores, as most GPU recipes do.
            torch.set_float32_matmul_precision('high')
            print_log('Training in float32 with TF32 matrix products '
                      '(optim_wrapper.mixed_precision=None).', logger='current',
                      level=logging.INFO)
        return cfg
    if wrapper not in AMP_OPTIM_WRAPPERS:
        raise ValueError(f'optim_wrapper.mixed_precision={choice!r} needs a wrapper with a '
                         f'mixed-precision counterpart, one of {sorted(AMP_OPTIM_WRAPPERS)}; '
                         f'got {wrapper!r}.')
    if not on_gpu and choice == 'bfloat16' and CPU_BFLOAT16_BACKWARD_CORRUPTS:
        raise ValueError(f'optim_wrapper.mixed_precision={choice!r} without a GPU: torch '
                         f"{torch.__version__}'s CPU attention kernel corrupts memory in the "
                         'bfloat16 backward. Train on the CPU in float32 '
                         '(optim_wrapper.mixed_precision=None), or use torch 2.2 or later.')
    # bfloat16 has float32's range: a loss scaler would only add a host read per step.
    loss_scale = dict(enabled=False) if choice == 'bfloat16' else 'dynamic'
    cfg.update(type=AMP_OPTIM_WRAPPERS[wrapper], dtype=choice, loss_scale=loss_scale)
    print_log(f'Training in mixed precision, {choice} ({reason}; '
              'optim_wrapper.mixed_precision=None trains in float32).', logger='current',
              level=logging.INFO)
    return cfg


#: The first compute capability with bfloat16 tensor cores (Ampere).
NATIVE_BF16_CAPABILITY = (8, 0)


def auto_precision() -> Tuple[str, str]:
    """``'auto'``'s choice on this process's CUDA GPU, and why, for the log."""
    capability = torch.cuda.get_device_capability()
    gpu = f'{torch.cuda.get_device_name()}, compute capability {capability[0]}.{capability[1]}'
    if tuple(capability) >= NATIVE_BF16_CAPABILITY:
        return 'bfloat16', f'auto: {gpu} runs bfloat16 natively'
    return 'float16', (f'auto: {gpu} has no bfloat16 tensor cores, so float16 with dynamic '
                       'loss scaling, as DINO')
