"""A hook for tests/test_resume.py: the process kills itself (SIGKILL, as a pre-emption
would) after a given training iteration, or in the middle of writing a checkpoint."""
import os
import signal

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class KillAtIterationHook(Hook):

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), signal.SIGKILL)
