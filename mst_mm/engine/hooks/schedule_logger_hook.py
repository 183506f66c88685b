"""Log the scheduled weight decay and the EMA teacher's momentum, as DINO logs ``wd``."""
from typing import Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseAveragedModel
from mmpretrain.registry import HOOKS

from .dino_schedule_hooks import unwrap


def ema_momentum(ema: BaseAveragedModel, steps: int) -> float:
    """The weight of the *new* value in the EMA update at ``steps`` (mmengine convention).

    The EMA's own ``avg_func`` is applied to a 0 average and a 1 source, which gives back
    its momentum, so the value follows whatever rule the averaged model uses (mmpretrain's
    ``CosineEMA`` reads ``max_iters`` from the message hub).

    Args:
        ema (BaseAveragedModel): The averaged model.
        steps (int): The number of updates done so far.

    Returns:
        float: The momentum ``m`` in ``average = (1 - m) * average + m * source``.
    """
    average, source = torch.zeros(()), torch.ones(())
    ema.avg_func(average, source, steps)
    return float(average)


@HOOKS.register_module()
class ScheduleLoggerHook(Hook):
    """Put the weight decay and the teacher momentum of every iteration in the logs.

    mmengine logs the learning rate of the first parameter group. MST also schedules the
    weight decay (cosine 0.04 -> 0.4) and the teacher's EMA momentum (cosine 0.996 -> 1),
    which DINO logs too. Before every iteration this hook writes to the message hub, and so
    to the console, ``scalars.json`` and TensorBoard:

    * ``wd``: the largest weight decay of the parameter groups, the one the decayed weights
      get (norms, biases and the [MASK] token have none);
    * ``teacher_momentum``: the weight of the *old* teacher in this iteration's EMA update,
      DINO's convention (``1 - m`` of mmengine's ``momentum`` ``m``), if the model has an
      EMA teacher.

    Args:
        None.
    """

    priority = 'NORMAL'

    def __init__(self) -> None:
        self._ema: Optional[BaseAveragedModel] = None

    def before_train(self, runner) -> None:
        """Find the model's EMA teacher, if it has one.

        Args:
            runner (Runner): The runner.
        """
        self._ema = next((m for m in unwrap(runner.model).modules()
                          if isinstance(m, BaseAveragedModel)), None)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """Log this iteration's weight decay and teacher momentum.

        Args:
            runner (Runner): The runner.
            batch_idx (int): The batch's index in the epoch.
            data_batch (dict | tuple | list, optional): The batch.
        """
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
