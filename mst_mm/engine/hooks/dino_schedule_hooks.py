"""DINO's per-epoch schedules that have no mmengine parameter scheduler.

Both hooks set an attribute on the unwrapped model before every iteration, computed from
the runner's epoch alone, so they behave the same with and without the DDP wrapper and
after a resume.
"""
import numpy as np
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmpretrain.registry import HOOKS


def unwrap(model):
    return model.module if is_model_wrapper(model) else model


@HOOKS.register_module()
class TeacherTempWarmupHook(Hook):
    r"""Warm the teacher temperature :math:`\tau_t` up linearly, then hold it (DINO).

    :math:`\tau_t(e)` = ``np.linspace(start, end, warmup_epochs)[e]`` for
    :math:`e < ` ``warmup_epochs``, else ``end``; written to ``model.head.teacher_temp``.

    Args:
        start (float): Defaults to 0.04.
        end (float): Defaults to 0.07.
        warmup_epochs (int): Defaults to 30.
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
        unwrap(runner.model).head.teacher_temp = temp
        runner.message_hub.update_scalar('train/teacher_temp', temp)


@HOOKS.register_module()
class FreezeLastLayerHook(Hook):
    """Keep the projection's last layer fixed for the first epochs (DINO's stabiliser).

    Before every iteration of the first ``freeze_epochs`` epochs the last layer's parameters
    are handed to the optimiser wrapper's ``freeze``: the gradient flows through the layer
    during backward (so DDP needs no ``find_unused_parameters``) and is then set to None
    before the update, so AdamW leaves the layer untouched (no step, no weight decay). This
    is DINO's ``cancel_gradients_last_layer``. Needs a ``DINOOptimWrapper`` (or its AMP
    twin), which is what the MST schedules use.

    Args:
        freeze_epochs (int): Defaults to 1.
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
        last_layer = unwrap(runner.model).neck.last_layer
        runner.optim_wrapper.freeze(last_layer.parameters() if frozen else [])
