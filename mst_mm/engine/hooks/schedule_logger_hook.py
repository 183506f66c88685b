"""Log the scheduled weight decay and the EMA teacher's momentum, as DINO logs ``wd``, and the
gradient statistics of DINO's clipping."""
from typing import Iterable, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseAveragedModel
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


@HOOKS.register_module()
class ScheduleLoggerHook(Hook):
    """Log ``train/wd`` (the largest group's weight decay: the decayed weights') and
    ``train/teacher_momentum`` (DINO's :math:`1 - m` of mmengine's EMA
    ``average = (1 - m) average + m source``) every iteration; mmengine logs only the lr.
    After each iteration, log what ``DINOOptimWrapper.pop_grad_stats`` holds
    (``train/grad_norm``, ``train/grad_clipped_ratio``)."""

    def __init__(self) -> None:
        self._ema: Optional[BaseAveragedModel] = None

    def before_train(self, runner) -> None:
        self._ema = next((m for m in get_ori_model(runner.model).modules()
                          if isinstance(m, BaseAveragedModel)), None)

    @staticmethod
    def _wrappers(runner) -> Iterable:
        # An OptimWrapperDict (several optimisers) holds its wrappers in `optim_wrappers`.
        return getattr(runner.optim_wrapper, 'optim_wrappers', {'': runner.optim_wrapper}).values()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        decays = [group.get('weight_decay', 0.0) for wrapper in self._wrappers(runner)
                  for group in wrapper.optimizer.param_groups]
        if decays:
            runner.message_hub.update_scalar('train/wd', float(max(decays)))
        if self._ema is not None:
            average = torch.zeros(())  # m read off the EMA's own update rule: any rule fits
            self._ema.avg_func(average, torch.ones(()), int(self._ema.steps))
            runner.message_hub.update_scalar('train/teacher_momentum', 1.0 - float(average))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        # Reading the tensors waits for the step to finish, as mmengine's logging of the
        # losses (RuntimeInfoHook, before this hook) has just done: no further wait.
        for wrapper in self._wrappers(runner):
            if hasattr(wrapper, 'pop_grad_stats'):
                for name, value in wrapper.pop_grad_stats().items():
                    runner.message_hub.update_scalar(f'train/{name}', float(value))
