"""Log the scheduled weight decay and the EMA teacher's momentum, as DINO logs ``wd``, and the
gradient statistics of DINO's clipping."""
from typing import Dict, Iterable, Optional

import torch
from mmengine.hooks import Hook, LoggerHook
from mmengine.model import BaseAveragedModel
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


@HOOKS.register_module()
class ScheduleLoggerHook(Hook):
    """Log ``train/wd`` (the largest group's weight decay: the decayed weights') every
    iteration and, on the iterations that the ``LoggerHook`` prints,
    ``train/teacher_momentum`` (DINO's :math:`1 - m` of mmengine's EMA
    ``average = (1 - m) average + m source``) and the mean over the iterations since the last
    print of what ``DINOOptimWrapper.pop_grad_stats`` holds (``train/grad_norm``,
    ``train/grad_clipped_ratio``); mmengine logs only the lr.

    The gradient statistics are summed on the device and read once per print, and the
    momentum comes from the EMA's own host-side count (``FusedCosineEMA.host_steps``): no
    iteration waits for the device on this hook's account.
    """

    def __init__(self) -> None:
        self._ema: Optional[BaseAveragedModel] = None
        self._interval = 1
        self._sums: Dict[str, torch.Tensor] = {}
        self._count = 0

    def before_train(self, runner) -> None:
        self._ema = next((m for m in get_ori_model(runner.model).modules()
                          if isinstance(m, BaseAveragedModel)), None)
        self._interval = next((hook.interval for hook in runner.hooks
                               if isinstance(hook, LoggerHook)), 1)

    @staticmethod
    def _wrappers(runner) -> Iterable:
        # An OptimWrapperDict (several optimisers) holds its wrappers in `optim_wrappers`.
        return getattr(runner.optim_wrapper, 'optim_wrappers', {'': runner.optim_wrapper}).values()

    def _prints(self, runner, batch_idx: int) -> bool:
        """Whether the LoggerHook prints after this iteration (its own rule)."""
        return (self.every_n_inner_iters(batch_idx, self._interval)
                or self.end_of_epoch(runner.train_dataloader, batch_idx))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        decays = [group.get('weight_decay', 0.0) for wrapper in self._wrappers(runner)
                  for group in wrapper.optimizer.param_groups]
        if decays:
            runner.message_hub.update_scalar('train/wd', float(max(decays)))
        if self._ema is not None and self._prints(runner, batch_idx):
            # The momentum of this iteration's update, read off the EMA's own rule (any rule
            # fits) at its update count, kept on the host by FusedCosineEMA.
            steps = getattr(self._ema, 'host_steps', None)
            steps = int(self._ema.steps) if steps is None else steps
            average = torch.zeros(())
            self._ema.avg_func(average, torch.ones(()), steps)
            runner.message_hub.update_scalar('train/teacher_momentum', 1.0 - float(average))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        stats = {name: value for wrapper in self._wrappers(runner)
                 if hasattr(wrapper, 'pop_grad_stats')
                 for name, value in wrapper.pop_grad_stats().items()}
        if stats:
            self._sums = {name: self._sums[name] + value if name in self._sums else value
                          for name, value in stats.items()}
            self._count += 1
        if self._sums and self._prints(runner, batch_idx):
            names = list(self._sums)
            means = (torch.stack([self._sums[name] for name in names]) / self._count).tolist()
            for name, mean in zip(names, means):
                runner.message_hub.update_scalar(f'train/{name}', mean)
            self._sums, self._count = {}, 0
