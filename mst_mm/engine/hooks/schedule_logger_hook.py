"""Log the scheduled weight decay and the EMA teacher's momentum, as DINO logs ``wd``."""
from typing import Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseAveragedModel
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


def ema_momentum(ema: BaseAveragedModel, steps: int) -> float:
    """The momentum ``m`` in ``average = (1 - m) * average + m * source`` after ``steps``
    updates (mmengine convention), read off the EMA's own ``avg_func`` so that any rule fits."""
    average, source = torch.zeros(()), torch.ones(())
    ema.avg_func(average, source, steps)
    return float(average)


@HOOKS.register_module()
class ScheduleLoggerHook(Hook):
    """Log every iteration's weight decay and teacher momentum, as DINO does; mmengine logs
    only the learning rate.

    ``wd`` is the largest group's weight decay (the decayed weights'); ``teacher_momentum`` is
    the old teacher's weight in the EMA update, DINO's ``1 - m`` of mmengine's ``m``.
    """

    priority = 'NORMAL'

    def __init__(self) -> None:
        self._ema: Optional[BaseAveragedModel] = None

    def before_train(self, runner) -> None:
        """Find the model's EMA teacher, if it has one."""
        self._ema = next((m for m in get_ori_model(runner.model).modules()
                          if isinstance(m, BaseAveragedModel)), None)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        decays = [group.get('weight_decay', 0.0) for group in
                  _param_groups(runner.optim_wrapper)]
        if decays:
            runner.message_hub.update_scalar('train/wd', float(max(decays)))
        if self._ema is not None:
            momentum = ema_momentum(self._ema, int(self._ema.steps))
            runner.message_hub.update_scalar('train/teacher_momentum', 1.0 - momentum)


def _param_groups(optim_wrapper) -> list:
    # An OptimWrapperDict (several optimisers) has no single optimizer attribute.
    optimizer = getattr(optim_wrapper, 'optimizer', None)
    if optimizer is not None:
        return optimizer.param_groups
    return [g for wrapper in getattr(optim_wrapper, 'values', lambda: [])()
            for g in wrapper.optimizer.param_groups]
