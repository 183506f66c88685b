"""DINO's per-epoch schedules that no mmengine parameter scheduler covers; resume-safe."""
import numpy as np
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


@HOOKS.register_module()
class TeacherTempWarmupHook(Hook):
    r"""DINO's teacher temperature, set on ``model.head.teacher_temp`` every iteration:
    :math:`\tau_t(e)` = ``np.linspace(start, end, warmup_epochs)[e]`` for
    :math:`e <` ``warmup_epochs``, then ``end``."""

    def __init__(self, start: float = 0.04, end: float = 0.07, warmup_epochs: int = 30) -> None:
        if warmup_epochs < 0:
            raise ValueError(f'warmup_epochs must be >= 0, got {warmup_epochs}.')
        self.start, self.end, self.warmup_epochs = start, end, warmup_epochs

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        epoch = runner.epoch
        temp = float(np.linspace(self.start, self.end, self.warmup_epochs)[epoch]
                     if epoch < self.warmup_epochs else self.end)
        get_ori_model(runner.model).head.teacher_temp = temp
        runner.message_hub.update_scalar('train/teacher_temp', temp)


@HOOKS.register_module()
class FreezeLastLayerHook(Hook):
    """Keep the neck's last layer fixed for the first ``freeze_epochs`` epochs (DINO's
    ``cancel_gradients_last_layer``) through ``DINOOptimWrapper.freeze``."""

    def __init__(self, freeze_epochs: int = 1) -> None:
        if freeze_epochs < 0:
            raise ValueError(f'freeze_epochs must be >= 0, got {freeze_epochs}.')
        self.freeze_epochs = freeze_epochs

    def before_train(self, runner) -> None:
        if not hasattr(runner.optim_wrapper, 'freeze'):
            raise TypeError(f'FreezeLastLayerHook needs a DINOOptimWrapper, optim_wrapper is a '
                            f'{type(runner.optim_wrapper).__name__}: set '
                            "optim_wrapper.type='DINOOptimWrapper' (or remove the hook).")

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        frozen = runner.epoch < self.freeze_epochs
        last_layer = get_ori_model(runner.model).neck.last_layer
        runner.optim_wrapper.freeze(last_layer.parameters() if frozen else [])
