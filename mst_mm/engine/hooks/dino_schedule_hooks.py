"""DINO's per-epoch schedules that no mmengine parameter scheduler covers.

Both set an attribute from the runner's epoch alone, so DDP and resume change nothing.
"""
import numpy as np
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


@HOOKS.register_module()
class TeacherTempWarmupHook(Hook):
    r"""Warm the teacher temperature :math:`\tau_t` up linearly, then hold it (DINO).

    :math:`\tau_t(e)` = ``np.linspace(start, end, warmup_epochs)[e]`` for
    :math:`e < ` ``warmup_epochs``, else ``end``; written to ``model.head.teacher_temp``.

    Args:
        start (float): Temperature at epoch 0.
        end (float): Temperature from ``warmup_epochs`` on.
        warmup_epochs (int): Length of the linear warm-up.
    """
    priority = 'NORMAL'

    def __init__(self, start: float = 0.04, end: float = 0.07, warmup_epochs: int = 30) -> None:
        if warmup_epochs < 0:
            raise ValueError(f'warmup_epochs must be >= 0, got {warmup_epochs}.')
        self.start, self.end, self.warmup_epochs = start, end, warmup_epochs

    def temperature(self, epoch: int) -> float:
        if epoch < self.warmup_epochs:
            return float(np.linspace(self.start, self.end, self.warmup_epochs)[epoch])
        return float(self.end)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        temp = self.temperature(runner.epoch)
        get_ori_model(runner.model).head.teacher_temp = temp
        runner.message_hub.update_scalar('train/teacher_temp', temp)


@HOOKS.register_module()
class FreezeLastLayerHook(Hook):
    """Keep the projection's last layer fixed for the first epochs (DINO's
    ``cancel_gradients_last_layer``), through ``DINOOptimWrapper.freeze``.

    The gradient still flows in backward, so DDP needs no ``find_unused_parameters``; the
    wrapper drops it before the update, so the layer gets no step and no weight decay.

    Args:
        freeze_epochs (int): Epochs during which the last layer stays fixed.
    """
    priority = 'NORMAL'

    def __init__(self, freeze_epochs: int = 1) -> None:
        if freeze_epochs < 0:
            raise ValueError(f'freeze_epochs must be >= 0, got {freeze_epochs}.')
        self.freeze_epochs = freeze_epochs

    def before_train(self, runner) -> None:
        if not hasattr(runner.optim_wrapper, 'freeze'):
            raise TypeError(
                'FreezeLastLayerHook cancels gradients in the optimiser wrapper, but '
                f'optim_wrapper is a {type(runner.optim_wrapper).__name__}: set '
                "optim_wrapper.type='DINOOptimWrapper' (or remove the hook).")

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        frozen = runner.epoch < self.freeze_epochs
        last_layer = get_ori_model(runner.model).neck.last_layer
        runner.optim_wrapper.freeze(last_layer.parameters() if frozen else [])
