"""DINO's two gradient rules between backward and update, as mmengine optimiser wrappers."""
from typing import Iterable, List, Optional

import torch
import torch.nn as nn
from mmengine.optim import AmpOptimWrapper, OptimWrapper

# The root registry, so that every scope (mmpretrain, mmdet, mmseg) finds the wrappers.
from mmengine.registry import OPTIM_WRAPPERS


class DINOGradientRulesMixin:
    r"""DINO's per-parameter gradient clipping and frozen parameters, before every update.

    mmengine clips only by the global norm (``type='norm'``) or by value. Per-parameter
    clipping (``clip_grad=dict(type='per_param', max_norm=c)``, DINO's ``clip_gradients``)
    logs ``train/grad_norm`` (pre-clip) and ``train/grad_clipped_ratio``:

    .. math::
        g_p \leftarrow g_p \cdot \min\Big(1, \frac{c}{\lVert g_p\rVert_2 + 10^{-6}}\Big).

    Frozen parameters (:meth:`freeze`) lose their gradient after backward, so they get no
    step and no decay, while DDP needs no ``find_unused_parameters``.
    """

    def __init__(self, *args, clip_grad: Optional[dict] = None, **kwargs) -> None:
        per_param_max_norm = None
        if clip_grad is not None and clip_grad.get('type') == 'per_param':
            options = {k: v for k, v in clip_grad.items() if k != 'type'}
            if set(options) != {'max_norm'} or not options['max_norm'] > 0:
                raise ValueError("clip_grad=dict(type='per_param') takes exactly one option, "
                                 f'max_norm > 0 (DINO uses 3.0); got {clip_grad}.')
            per_param_max_norm = float(options['max_norm'])
            clip_grad = None
        super().__init__(*args, clip_grad=clip_grad, **kwargs)
        self.per_param_max_norm = per_param_max_norm
        if per_param_max_norm is not None:
            # Non-empty, so AmpOptimWrapper unscales the gradients before `_clip_grad`.
            self.clip_grad_kwargs = dict(max_norm=per_param_max_norm)
        self._frozen: list = []

    def freeze(self, params: Iterable[nn.Parameter]) -> None:
        """Cancel the gradients of ``params`` at every following step (empty: none)."""
        self._frozen = list(params)

    @property
    def frozen_params(self) -> List[nn.Parameter]:
        """The parameters whose gradients the next step cancels."""
        return list(self._frozen)

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
        factors = norms.add(1e-6).reciprocal_().mul_(self.per_param_max_norm)
        factors.clamp_(max=1.0)
        torch._foreach_mul_(grads, list(factors.unbind()))
        total_norm = torch.linalg.vector_norm(norms)
        self.message_hub.update_scalar('train/grad_norm', float(total_norm))
        self.message_hub.update_scalar('train/grad_clipped_ratio',
                                       float((factors < 1).float().mean()))


@OPTIM_WRAPPERS.register_module()
class DINOOptimWrapper(DINOGradientRulesMixin, OptimWrapper):
    """mmengine's ``OptimWrapper`` with DINO's gradient rules (:class:`DINOGradientRulesMixin`).

    Args:
        optimizer (Optimizer): The wrapped optimiser.
        clip_grad (dict, optional): ``dict(type='per_param', max_norm=3.0)`` for DINO's
            clipping; ``type='norm'`` / ``'value'`` as in mmengine. Defaults to None.
        **kwargs: The other arguments of ``OptimWrapper``.
    """


@OPTIM_WRAPPERS.register_module()
class DINOAmpOptimWrapper(DINOGradientRulesMixin, AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` with DINO's gradient rules, unscaling before clipping;
    what ``--amp`` selects for :class:`DINOOptimWrapper`.

    Args:
        optimizer (Optimizer): The wrapped optimiser.
        clip_grad (dict, optional): As for :class:`DINOOptimWrapper`.
        **kwargs: The other arguments of ``AmpOptimWrapper`` (``loss_scale``, ``dtype``).
    """


# `tools/train.py --amp` swaps a wrapper type for its mixed-precision counterpart.
AMP_OPTIM_WRAPPERS = {
    'OptimWrapper': 'AmpOptimWrapper',
    'AmpOptimWrapper': 'AmpOptimWrapper',
    'DINOOptimWrapper': 'DINOAmpOptimWrapper',
    'DINOAmpOptimWrapper': 'DINOAmpOptimWrapper',
}
