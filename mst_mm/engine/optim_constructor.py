"""mmengine's optimiser constructor without the EMA teacher, plus DINO's clipping under
``--amp``.

mmengine's ``paramwise_cfg`` has no way to leave out a sub-module, so it warns once per EMA
teacher parameter; ``--amp`` sets ``AmpOptimWrapper``, which cannot clip per parameter; and with a
``paramwise_cfg`` mmengine hands the optimiser ``ConfigDict`` parameter groups, which
``torch.compile`` cannot trace, so mmengine's ``compile=True`` fails in the first optimiser
step. The parameter groups hold exactly mmengine's settings, as plain dicts.
"""
import logging
from typing import List, Optional, Union

from mmengine.logging import print_log
from mmengine.model import BaseAveragedModel
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmpretrain.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn

# The wrappers that apply DINO's gradient rules, by the type a config or --amp names.
_DINO_TWINS = {'OptimWrapper': 'DINOOptimWrapper', 'AmpOptimWrapper': 'DINOAmpOptimWrapper',
               'DINOOptimWrapper': 'DINOOptimWrapper',
               'DINOAmpOptimWrapper': 'DINOAmpOptimWrapper'}


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class StudentOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` that leaves averaged (EMA) models out and builds the
    DINO twin of the wrapper when ``clip_grad=dict(type='per_param')``."""

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        clip_grad = optim_wrapper_cfg.get('clip_grad') or {}
        if clip_grad.get('type') == 'per_param':
            optim_wrapper_cfg = dict(optim_wrapper_cfg)
            wrapper = optim_wrapper_cfg.get('type', 'OptimWrapper')
            if wrapper not in _DINO_TWINS:
                raise ValueError(
                    f"clip_grad=dict(type='per_param') is DINO's rule, which only "
                    f'{sorted(set(_DINO_TWINS.values()))} apply; optim_wrapper.type is '
                    f"{wrapper!r}. Use 'DINOOptimWrapper' (mixed precision: "
                    "'DINOAmpOptimWrapper'), or clip_grad=dict(type='norm', ...).")
            if _DINO_TWINS[wrapper] != wrapper:
                print_log(f'optim_wrapper.type {wrapper!r} (set by --amp?) cannot clip per '
                          f'parameter: building its DINO twin {_DINO_TWINS[wrapper]!r}.',
                          logger='current', level=logging.INFO)
            optim_wrapper_cfg['type'] = _DINO_TWINS[wrapper]
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    def __call__(self, model: nn.Module) -> OptimWrapper:
        optim_wrapper = super().__call__(model)
        # The same settings as plain dicts: a ConfigDict group stops torch.compile's trace of
        # the optimiser (mmengine's config converts the groups when it stores them).
        groups = optim_wrapper.optimizer.param_groups
        groups[:] = [dict(group) for group in groups]
        return optim_wrapper

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: Optional[Union[int, float]] = None) -> None:
        """mmengine's ``add_params``, except that an EMA model adds nothing."""
        if isinstance(module, BaseAveragedModel):
            count = sum(p.numel() for p in module.parameters())
            print_log(f'{prefix or type(module).__name__}: an averaged model '
                      f'({type(module).__name__}, {count:,} values) follows the trained '
                      'parameters through its update rule; left out of the optimiser.',
                      logger='current', level=logging.DEBUG)
            return
        super().add_params(params, module, prefix, is_dcn_module)

