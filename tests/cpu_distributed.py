"""DDP and SyncBatchNorm for CPU processes (gloo), for the multi-process tests only.

torch's ``SyncBatchNorm`` and mmengine's DDP set-up (``device_ids``) are GPU-only; a test
selects the wrapper by its import path, which mmengine's registry resolves:
``--cfg-options model_wrapper_cfg.type=tests.cpu_distributed.DeviceAgnosticDDP``.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.model import MMDistributedDataParallel

# mmengine's Runner looks the wrapper type up in its own root registry, without a scope.
from mmengine.registry import MODEL_WRAPPERS
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce
from torch.nn.modules.batchnorm import _BatchNorm


class CPUSyncBatchNorm(_BatchNorm):
    """Synchronised BatchNorm for CPU tensors (gloo); plain BN in eval or without a group.

    Same state as ``nn.SyncBatchNorm`` (DDP refuses that one in CPU modules). Global-batch
    statistics by the corrected two-pass algorithm: mean = shift + r, var = E[(x - shift)^2]
    - r^2 with shift the all-reduced mean and r = E[x - shift] its rounding error; the
    one-pass E[x^2] - mean^2 goes negative for 300 + 0.01 N(0, 1) in float32. Both
    all-reduces are differentiable, so gradients match one large batch.
    """

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f'expected at least 2D input (got {x.dim()}D input)')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise this rank's ``x`` (N, C, ...) with the statistics of every rank's batch."""
        if not self.training or not dist.is_initialized():
            return super().forward(x)
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, channels] + [1] * (x.dim() - 2)
        total = differentiable_all_reduce(torch.cat([x.sum(dims),
                                                     x.new_tensor([x.numel() / channels])]))
        count = total[-1]
        shift = total[:channels] / count
        centred = x - shift.view(shape)
        moments = differentiable_all_reduce(
            torch.cat([centred.sum(dims), (centred * centred).sum(dims)])) / count
        # `residual` is the rounding error of `shift`, tiny against the spread: squaring it
        # cancels nothing.
        residual = moments[:channels]
        mean = shift + residual
        var = moments[channels:] - residual * residual
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = (1.0 / float(self.num_batches_tracked)
                            if self.momentum is None else self.momentum)
                unbiased = var * count / (count - 1).clamp(min=1)
                self.running_mean.mul_(1 - momentum).add_(momentum * mean)
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased)
        y = (centred - residual.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


@MODEL_WRAPPERS.register_module()
class DeviceAgnosticDDP(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that also wraps a CPU model: no ``device_ids`` (DDP
    rejects them on CPU) and ``SyncBatchNorm`` becomes :class:`CPUSyncBatchNorm` in place."""

    def __init__(self, module: nn.Module, device_ids=None, **kwargs) -> None:
        if next(module.parameters()).device.type == 'cpu':
            device_ids = None
            for m in module.modules():
                if type(m) is nn.SyncBatchNorm:
                    m.__class__ = CPUSyncBatchNorm  # same __dict__: params and buffers
        super().__init__(module=module, device_ids=device_ids, **kwargs)
