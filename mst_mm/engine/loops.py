"""An epoch-based train loop that resumes in the middle of an epoch.

mmengine's ``EpochBasedTrainLoop`` restarts the checkpoint's epoch: a mid-epoch checkpoint
would train ``j`` batches twice and put iteration-based schedules ``j`` steps ahead.
"""
import itertools
from typing import Iterator

from mmengine.runner import EpochBasedTrainLoop
from mmpretrain.registry import LOOPS


class _SkipFirst:
    """A sampler without the first ``count`` indices of another; same length, so the hooks'
    "last iteration of the epoch" tests do not change."""

    def __init__(self, sampler, count: int) -> None:
        self.sampler, self.count = sampler, count

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.count, None)

    def __len__(self) -> int:
        return len(self.sampler)


@LOOPS.register_module()
class MidEpochResumeTrainLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` whose resumed epoch trains only the batches it had left.

    The sampler replays the epoch's order and the trained batches are left out as indices,
    before any image is loaded; hooks see the epoch's own batch indices. The rest of the
    epoch repeats the image order, not the crops (docs/checkpoints_logs_and_tools.md).
    """

    def run_epoch(self) -> None:
        """Iterate one epoch, or what remains of a resumed one."""
        batches = len(self.dataloader)
        done = self._iter - self._epoch * batches
        if done <= 0:
            return super().run_epoch()
        if done >= batches:
            raise ValueError(
                f'The resumed checkpoint is at iteration {self._iter} of epoch '
                f'{self._epoch + 1}, but an epoch has {batches} iterations here: the batch '
                'size, the number of GPUs or the dataset differ from the interrupted run. '
                'Resume with the same settings, or from a checkpoint saved at an epoch end.')
        batch_sampler = getattr(self.dataloader, 'batch_sampler', None)
        if batch_sampler is None or not hasattr(batch_sampler, 'sampler'):
            raise TypeError(
                f'{type(self).__name__} resumes mid-epoch by leaving out sampler indices, '
                f'but this data loader has no batch sampler with a .sampler '
                f'({type(batch_sampler).__name__}): resume from a checkpoint saved at an '
                'epoch end, or use a batch sampler that wraps a sampler.')
        self.runner.logger.info(f'Resuming in the middle of epoch {self._epoch + 1}: '
                                f'{done} of its {batches} batches were trained already.')
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        sampler = batch_sampler.sampler
        batch_sampler.sampler = _SkipFirst(sampler, done * batch_sampler.batch_size)
        try:
            for idx, data_batch in enumerate(self.dataloader, start=done):
                self.run_iter(idx, data_batch)
        finally:
            batch_sampler.sampler = sampler
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1
