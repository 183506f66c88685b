"""Checkpoints that a kill during the save cannot take away, and a rolling ``latest.pth``."""
import os
import os.path as osp

from mmengine.dist import is_main_process
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmpretrain.registry import HOOKS


def _replace_atomically(tmp_path: str, path: str) -> None:
    with open(tmp_path, 'rb+') as f:
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp_path, path)


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` whose saves a kill cannot corrupt, plus ``latest.pth`` at
    every epoch end that keeps no ``epoch_N.pth`` (a pre-emption costs at most one epoch).

    mmengine 0.10.7 deletes the outdated checkpoint, then writes the new one in place: a kill
    in between leaves none. Here each file is written under a temporary name, then renamed;
    the outdated one goes after. Non-local storage gets mmengine's hook."""

    def __init__(self, *args, latest_filename: str = 'latest.pth', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.latest_filename = latest_filename

    def after_train_epoch(self, runner) -> None:
        kept_before = self.last_ckpt
        super().after_train_epoch(runner)
        if (self.by_epoch and self.last_ckpt == kept_before
                and isinstance(self.file_backend, LocalBackend)):
            runner.logger.info(f'Saving {self.latest_filename} at {runner.epoch + 1} epochs')
            self._write(runner, self.latest_filename,
                        dict(epoch=runner.epoch + 1, iter=runner.iter))

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        if not isinstance(self.file_backend, LocalBackend):
            return super()._save_checkpoint_with_step(runner, step, meta)
        outdated = []  # mmengine's bookkeeping (saved in the checkpoint); the deletion waits
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated.append(self.filename_tmpl.format(self.keep_ckpt_ids.popleft()))
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = osp.join(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        if self._write(runner, filename, meta):
            # The kept checkpoint is the newest state now: an older latest.pth only misleads.
            for name in [self.latest_filename, *outdated]:
                if osp.isfile(osp.join(self.out_dir, name)):
                    os.remove(osp.join(self.out_dir, name))

    def _write(self, runner, filename: str, meta: dict) -> bool:
        """Save via a temporary file, point ``last_checkpoint`` at it; True on the main process."""
        partial = f'.{filename}.partial'
        runner.save_checkpoint(
            self.out_dir, partial, self.file_client_args, save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=self.by_epoch,
            backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return False
        path = osp.abspath(osp.join(self.out_dir, filename))
        _replace_atomically(osp.join(self.out_dir, partial), path)
        pointer = osp.join(runner.work_dir, 'last_checkpoint')
        with open(pointer + '.partial', 'w') as f:
            f.write(path)
        _replace_atomically(pointer + '.partial', pointer)
        return True
