"""Checkpoints that a kill during the save cannot take away, in a work dir that can move,
and a rolling ``latest.pth`` so that a pre-emption costs at most one epoch."""
import logging
import os
import os.path as osp
import re
from typing import Optional

from mmengine.dist import is_main_process
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmpretrain.registry import HOOKS

from ..errors import ConfigValueError
from ..resume import POINTER, find_resume_checkpoint

_STEP_LIKE = re.compile(r'^(epoch|iter)_\d+\.pth$')


def _replace_atomically(tmp_path: str, path: str) -> None:
    with open(tmp_path, 'rb+') as f:
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp_path, path)


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` with a save that a kill cannot corrupt, a
    ``last_checkpoint`` relative to the work dir, and a rolling ``latest.pth``.

    mmengine 0.10.7 deletes the outdated checkpoint before writing the new one in place, so a
    kill mid-save can leave no usable checkpoint. On other storage than a local disk this is
    mmengine's hook. See docs/reliability.md and docs/checkpoints_logs_and_tools.md.

    Args:
        latest_interval (int): Rewrite ``latest.pth`` every this many epochs (or iterations);
            0 turns the rolling checkpoint off.
        latest_by_epoch (bool, optional): Count ``latest_interval`` in epochs or iterations
            (these need ``MidEpochResumeTrainLoop``). None: the hook's ``by_epoch``.
        latest_filename (str): The rolling checkpoint's name.
        *args, **kwargs: ``CheckpointHook``'s arguments.
    """

    def __init__(self, *args, latest_interval: int = 1, latest_by_epoch: Optional[bool] = None,
                 latest_filename: str = 'latest.pth', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(latest_interval, int) or latest_interval < 0:
            raise ValueError(f'latest_interval must be an int >= 0 (0 turns the rolling '
                             f'latest checkpoint off), got {latest_interval!r}.')
        if not latest_filename.endswith('.pth') or osp.basename(latest_filename) != \
                latest_filename or _STEP_LIKE.match(latest_filename):
            raise ValueError(f'latest_filename must be a plain *.pth file name that is not '
                             f'of the form epoch_N.pth / iter_N.pth, got {latest_filename!r}.')
        self.latest_interval = latest_interval
        self.latest_by_epoch = self.by_epoch if latest_by_epoch is None else latest_by_epoch
        self.latest_filename = latest_filename
        # Files this process wrote and may replace; any other existing file is kept aside.
        self._written = set()
        # Completed iterations at the last save of either kind: a step is saved once.
        self._saved_at_iter: Optional[int] = None

    def before_run(self, runner) -> None:
        """Resolve auto-resume's ``last_checkpoint`` in the work dir."""
        super().before_run(runner)
        # mmengine would read the pointer from the cwd; tools/train.py does this itself.
        if getattr(runner, '_resume', False) and getattr(runner, '_load_from', None) is None:
            runner._load_from = find_resume_checkpoint(runner.work_dir)

    def before_train(self, runner) -> None:
        """mmengine's set-up, then keep a resumed best checkpoint's path in this work dir."""
        super().before_train(runner)
        self._check_loop_resumes_mid_epoch(runner)
        # Else a copied work dir's new best would delete the original's best checkpoint.
        if getattr(self, 'best_ckpt_path', None):
            self.best_ckpt_path = self._rebased(self.best_ckpt_path)
        for key, path in getattr(self, 'best_ckpt_path_dict', {}).items():
            if path:
                self.best_ckpt_path_dict[key] = self._rebased(path)

    def _check_loop_resumes_mid_epoch(self, runner) -> None:
        # mmengine's EpochBasedTrainLoop would train a mid-epoch checkpoint's epoch again.
        from mmengine.runner import EpochBasedTrainLoop

        from ..loops import MidEpochResumeTrainLoop
        loop = getattr(runner, 'train_loop', None)
        if (self._rolls() and not self.latest_by_epoch
                and isinstance(loop, EpochBasedTrainLoop)
                and not isinstance(loop, MidEpochResumeTrainLoop)):
            raise ConfigValueError(
                f'{type(self).__name__}(latest_by_epoch=False) saves the rolling checkpoint '
                f'every {self.latest_interval} iterations, inside epochs, but '
                f'{type(loop).__name__} resumes only at epoch starts: it would train the '
                "interrupted epoch again from its start. Set train_cfg.type="
                "'MidEpochResumeTrainLoop' (mst_mm's EpochBasedTrainLoop that resumes "
                'mid-epoch), or count the rolling checkpoint in epochs '
                '(default_hooks.checkpoint.latest_by_epoch=True).')

    def _keep_earlier_file(self, path: str) -> None:
        # A run resumed from an earlier checkpoint saves existing epochs again: move them aside.
        if not osp.exists(path) or path in self._written:
            return
        kept, n = f'{path}.previous', 1
        while osp.exists(kept):
            kept, n = f'{path}.previous{n}', n + 1
        os.replace(path, kept)
        print_log(f'{path} existed from an earlier run or attempt: kept it as {kept}.',
                  logger='current', level=logging.WARNING)

    def _rebased(self, path: str) -> str:
        if not isinstance(self.file_backend, LocalBackend):
            return path
        here = osp.join(self.out_dir, osp.basename(path))
        if osp.realpath(osp.dirname(path)) != osp.realpath(self.out_dir):
            print_log(f'The resumed best checkpoint {path} lies outside {self.out_dir}; '
                      f'this run manages {here} instead and leaves {path} alone.',
                      logger='current', level=logging.WARNING)
            return here
        return path

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """mmengine's saving by iterations, then the rolling checkpoint if it counts them."""
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        if (self._rolls() and not self.latest_by_epoch
                and self.every_n_train_iters(runner, self.latest_interval)):
            self._save_latest(runner, dict(epoch=runner.epoch, iter=runner.iter + 1))

    def after_train_epoch(self, runner) -> None:
        """mmengine's saving by epochs, then the rolling checkpoint if it counts epochs."""
        super().after_train_epoch(runner)
        if (self._rolls() and self.latest_by_epoch
                and self.every_n_epochs(runner, self.latest_interval)):
            self._save_latest(runner, dict(epoch=runner.epoch + 1, iter=runner.iter))

    def _rolls(self) -> bool:
        return self.latest_interval > 0 and isinstance(self.file_backend, LocalBackend)

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        if not isinstance(self.file_backend, LocalBackend):
            return super()._save_checkpoint_with_step(runner, step, meta)
        outdated = None
        # mmengine's bookkeeping (saved in the checkpoint); only the deletion waits.
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids
                                            and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        filename = self.filename_tmpl.format(step)
        self.last_ckpt = osp.join(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        self._saved_at_iter = meta.get('iter')
        if not self._write_safely(runner, filename, meta):
            return
        # The kept checkpoint is now the newest state: an older rolling one only misleads.
        latest = osp.join(self.out_dir, self.latest_filename)
        if osp.isfile(latest):
            if latest in self._written or self._resumed_from(runner, latest):
                os.remove(latest)
                self._written.discard(latest)
            else:
                self._keep_earlier_file(latest)
        if outdated is not None:
            old = osp.join(self.out_dir, self.filename_tmpl.format(outdated))
            if osp.isfile(old):
                os.remove(old)

    def _save_latest(self, runner, meta: dict) -> None:
        """Rewrite the rolling checkpoint, unless a kept one holds this very step."""
        if meta['iter'] == self._saved_at_iter:
            return
        latest = osp.join(self.out_dir, self.latest_filename)
        if self._resumed_from(runner, latest):
            self._written.add(latest)  # its state lives on in this run: rewrite it
        runner.logger.info(f'Saving the rolling checkpoint {self.latest_filename} at '
                           f'{meta["epoch"]} epochs, {meta["iter"]} iterations')
        self._saved_at_iter = meta['iter']
        self._write_safely(runner, self.latest_filename, meta)

    def _write_safely(self, runner, filename: str, meta: dict) -> bool:
        """Write ``filename`` through a partial file, then point at it; True on the main process."""
        partial = f'.{filename}.partial'
        runner.save_checkpoint(
            self.out_dir, partial, self.file_client_args, save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=self.by_epoch,
            backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return False
        path = osp.join(self.out_dir, filename)
        self._keep_earlier_file(path)
        _replace_atomically(osp.join(self.out_dir, partial), path)
        self._written.add(path)
        pointer = osp.join(runner.work_dir, POINTER)
        with open(pointer + '.partial', 'w') as f:
            # Relative to the work dir, so that the pointer moves with it.
            f.write(osp.relpath(path, runner.work_dir))
        _replace_atomically(pointer + '.partial', pointer)
        return True

    @staticmethod
    def _resumed_from(runner, path: str) -> bool:
        source = getattr(runner, '_load_from', None)
        return (bool(getattr(runner, '_resume', False)) and isinstance(source, str)
                and osp.realpath(source) == osp.realpath(path))
