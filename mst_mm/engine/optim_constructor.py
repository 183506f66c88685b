"""mmengine's optimiser constructor without the EMA teacher, and DINO's clipping under ``--amp``."""
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
    """``DefaultOptimWrapperConstructor`` that leaves averaged (EMA) models out (``paramwise_cfg``
    cannot: it warns once per teacher parameter), gives plain dict parameter groups (``ConfigDict``
    ones stop ``torch.compile``), and builds the DINO twin of the wrapper for
    ``clip_grad=dict(type='per_param')`` (``--amp`` sets ``AmpOptimWrapper``)."""

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        if (optim_wrapper_cfg.get('clip_grad') or {}).get('type') == 'per_param':
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
            optim_wrapper_cfg = dict(optim_wrapper_cfg, type=_DINO_TWINS[wrapper])
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    def __call__(self, model: nn.Module) -> OptimWrapper:
        optim_wrapper = super().__call__(model)
        groups = optim_wrapper.optimizer.param_groups
        groups[:] = [dict(group) for group in groups]  # the same settings, traceable
        return optim_wrapper

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: Optional[Union[int, float]] = None) -> None:
        if not isinstance(module, BaseAveragedModel):  # it follows by its own update rule
            super().add_params(params, module, prefix, is_dcn_module)
