"""Faults injected into training runs by the tests: a pre-emption (SIGKILL) during a save, a
student whose loss turns NaN, and an error on one rank."""
import os
import signal

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class PoisonAtIterationHook(Hook):
    """Sets the student's CLS token to NaN just before the given iteration."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter + 1 == self.iteration:
            runner.model.backbone.cls_token.data.fill_(float('nan'))


@HOOKS.register_module()
class KillDuringSaveHook(Hook):
    """SIGKILL after half of the given epoch's checkpoint bytes reached the disk."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if checkpoint['meta']['epoch'] != self.epoch:
            return
        from mmengine.fileio.backends import LocalBackend

        def put_half_then_die(backend, obj: bytes, filepath) -> None:
            with open(filepath, 'wb') as f:
                f.write(obj[:len(obj) // 2])
            os.kill(os.getpid(), signal.SIGKILL)

        LocalBackend.put = put_half_then_die


@HOOKS.register_module()
class RaiseOnRankHook(Hook):
    """Raises on one rank only, at the given iteration, while the others go on."""

    def __init__(self, iteration: int, rank: int = 1) -> None:
        self.iteration, self.rank = iteration, rank

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        from mmengine.dist import get_rank
        if runner.iter + 1 == self.iteration and get_rank() == self.rank:
            raise RuntimeError(f'injected fault on rank {self.rank}')
