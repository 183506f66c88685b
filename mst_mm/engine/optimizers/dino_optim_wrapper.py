"""DINO's two gradient rules between backward and update, as mmengine optimiser wrappers."""
from typing import Dict, Iterable, List, Optional

import torch
import torch.nn as nn
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS  # the root one: every scope finds the wrappers


class DINOGradientRulesMixin:
    r"""DINO's rules before every update. ``clip_grad=dict(type='per_param', max_norm=c)``
    (DINO's ``clip_gradients``; mmengine clips only globally or by value):
    :math:`g_p \leftarrow g_p \min\big(1, c / (\lVert g_p\rVert_2 + 10^{-6})\big)`, with
    ``grad_norm`` (the global norm before) and ``grad_clipped_ratio`` (the share of clipped
    tensors) kept as tensors until :meth:`pop_grad_stats` (``ScheduleLoggerHook`` logs them as
    ``train/...`` after each iteration). :meth:`freeze`'s parameters lose their gradient after
    backward: no step, no decay, no ``find_unused_parameters``."""

    def __init__(self, *args, clip_grad: Optional[dict] = None, **kwargs) -> None:
        max_norm = None
        if clip_grad is not None and clip_grad.get('type') == 'per_param':
            if set(clip_grad) != {'type', 'max_norm'} or not clip_grad['max_norm'] > 0:
                raise ValueError("clip_grad=dict(type='per_param') takes exactly one option, "
                                 f'max_norm > 0 (DINO uses 3.0); got {clip_grad}.')
            max_norm, clip_grad = float(clip_grad['max_norm']), None
        super().__init__(*args, clip_grad=clip_grad, **kwargs)
        self.per_param_max_norm = max_norm
        if max_norm is not None:
            # Non-empty, so that AmpOptimWrapper unscales the gradients before `_clip_grad`.
            self.clip_grad_kwargs = dict(max_norm=max_norm)
        self._frozen: List[nn.Parameter] = []
        self._grad_stats: Dict[str, torch.Tensor] = {}

    def freeze(self, params: Iterable[nn.Parameter]) -> None:
        """Cancel the gradients of ``params`` at every following step (empty: none)."""
        self._frozen = list(params)

    @property
    def frozen_params(self) -> List[nn.Parameter]:  # those whose gradients the next step cancels
        return list(self._frozen)

    def pop_grad_stats(self) -> Dict[str, torch.Tensor]:
        """The last clipping's statistics, 0-dim tensors on the gradients' device, and forget
        them (empty: no clipping since the last call).

        They stay on the device because reading one waits for the whole step: the logger
        reads them after the iteration, where it reads the losses anyway.
        """
        stats, self._grad_stats = self._grad_stats, {}
        return stats

    def step(self, **kwargs) -> None:
        for param in self._frozen:
            param.grad = None
        super().step(**kwargs)

    def _clip_grad(self) -> None:
        if self.per_param_max_norm is None:
            return super()._clip_grad()
        grads = [p.grad for group in self.optimizer.param_groups for p in group['params']
                 if p.requires_grad and p.grad is not None]
        if not grads:
            return
        norms = torch.stack(torch._foreach_norm(grads))
        # Multiplying by exactly 1 leaves an unclipped gradient bit for bit as it was.
        factors = norms.add(1e-6).reciprocal_().mul_(self.per_param_max_norm).clamp_(max=1.0)
        torch._foreach_mul_(grads, list(factors.unbind()))
        self._grad_stats = dict(grad_norm=torch.linalg.vector_norm(norms),
                                grad_clipped_ratio=(factors < 1).float().mean())


@OPTIM_WRAPPERS.register_module()
class DINOOptimWrapper(DINOGradientRulesMixin, OptimWrapper):
    """mmengine's ``OptimWrapper`` with :class:`DINOGradientRulesMixin`'s gradient rules."""


@OPTIM_WRAPPERS.register_module()
class DINOAmpOptimWrapper(DINOGradientRulesMixin, AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` with DINO's rules on the unscaled gradients (``--amp``)."""


# `tools/train.py --amp` swaps a wrapper type for its mixed-precision counterpart.
AMP_OPTIM_WRAPPERS = {'OptimWrapper': 'AmpOptimWrapper', 'AmpOptimWrapper': 'AmpOptimWrapper',
                      'DINOOptimWrapper': 'DINOAmpOptimWrapper',
                      'DINOAmpOptimWrapper': 'DINOAmpOptimWrapper'}
