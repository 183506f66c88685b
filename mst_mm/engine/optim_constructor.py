"""mmengine's optimiser constructor without the EMA teacher, and DINO's clipping under ``--amp``."""
import logging
from typing import List, Optional, Union

import torch
from mmengine.logging import print_log
from mmengine.model import BaseAveragedModel
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmpretrain.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn
from torch.optim import Optimizer

from ..compat import fused_supported
from .mixed_precision import resolve_mixed_precision

# The wrappers that apply DINO's gradient rules, by the type a config or --amp names.
_DINO_TWINS = {'OptimWrapper': 'DINOOptimWrapper', 'AmpOptimWrapper': 'DINOAmpOptimWrapper',
               'DINOOptimWrapper': 'DINOOptimWrapper',
               'DINOAmpOptimWrapper': 'DINOAmpOptimWrapper'}


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class StudentOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` that leaves averaged (EMA) models out (``paramwise_cfg``
    cannot: it warns once per teacher parameter), gives plain dict parameter groups (``ConfigDict``
    ones stop ``torch.compile``), merges the groups whose settings are equal
    (:func:`merge_param_groups`; ``optim_wrapper.merge_param_groups=False`` keeps mmengine's one
    group per parameter), and builds the DINO twin of the wrapper for
    ``clip_grad=dict(type='per_param')`` (``--amp`` sets ``AmpOptimWrapper``)."""

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        optim_wrapper_cfg = resolve_mixed_precision(optim_wrapper_cfg)
        # Taken out before mmengine hands the rest of the config to the wrapper.
        self.merge_param_groups = bool(optim_wrapper_cfg.pop('merge_param_groups', True))
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
        self.optimizer_cfg = _fused_where_supported(self.optimizer_cfg, model)
        optim_wrapper = super().__call__(model)
        optimizer = optim_wrapper.optimizer
        groups = [dict(group) for group in optimizer.param_groups]  # traceable settings
        if self.merge_param_groups:
            groups = merge_param_groups(groups)
            optimizer.register_load_state_dict_pre_hook(_refuse_per_parameter_groups)
        optimizer.param_groups[:] = groups
        return optim_wrapper

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: Optional[Union[int, float]] = None) -> None:
        if not isinstance(module, BaseAveragedModel):  # it follows by its own update rule
            super().add_params(params, module, prefix, is_dcn_module)


def _fused_where_supported(optimizer_cfg: dict, model: nn.Module) -> dict:
    """``optimizer_cfg`` with ``fused=True`` swapped for ``foreach=True`` where this torch has
    no fused kernel for the model's device (AdamW on the CPU before torch 2.4): the same
    update up to float rounding, a multi-tensor loop instead of one kernel."""
    optimizer = getattr(torch.optim, str(optimizer_cfg.get('type')), None)
    param = next(model.parameters(), None)
    if (not optimizer_cfg.get('fused') or optimizer is None or param is None
            or fused_supported(optimizer, param.device)):
        return optimizer_cfg
    print_log(f'torch {torch.__version__} has no fused {optimizer.__name__} for parameters on '
              f'{param.device.type}: using foreach=True (the same update, up to float '
              'rounding) instead of fused=True.', logger='current', level=logging.INFO)
    return {**{k: v for k, v in optimizer_cfg.items() if k != 'fused'}, 'foreach': True}


def merge_param_groups(groups: List[dict]) -> List[dict]:
    """One group per distinct setting: the groups whose entries other than ``'params'`` are
    all equal become one, whose parameters are theirs in order; the merged groups keep the
    order in which their settings first appear.

    ``paramwise_cfg`` (no decay on biases, norms and [MASK]) gives one group per parameter,
    177 for DeiT-S; every setting and every per-parameter rule (AdamW, per-parameter
    clipping, freezing) applies to each tensor alone, so merging changes no number, only
    the Python work per step of the optimiser and of every parameter scheduler.
    """
    merged: List[dict] = []
    for group in groups:
        settings = {key: value for key, value in group.items() if key != 'params'}
        same = next((m for m in merged
                     if {k: v for k, v in m.items() if k != 'params'} == settings), None)
        if same is None:
            merged.append(dict(group, params=list(group['params'])))
        else:
            same['params'].extend(group['params'])
    return merged


def _refuse_per_parameter_groups(optimizer: Optimizer, state_dict: dict) -> None:
    """Name the cause and the fix where torch would only say that the group counts differ."""
    saved = state_dict['param_groups']
    if len(saved) != len(optimizer.param_groups) and all(len(g['params']) == 1 for g in saved):
        raise ValueError(
            f'The optimiser state to load has {len(saved)} parameter groups of one parameter '
            f'each: it was saved before StudentOptimWrapperConstructor merged the groups of '
            f'equal settings, and this optimiser has {len(optimizer.param_groups)}. The '
            "parameter schedulers' saved states are per group too. Resume it with "
            '`--cfg-options optim_wrapper.merge_param_groups=False` (one group per parameter, '
            'as it was saved), or start from its weights alone with `load_from` (new '
            'optimiser moments and schedules).')
