"""Checkpoints that a kill during the save cannot take away."""
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
    """mmengine's ``CheckpointHook`` with a save that a pre-emption cannot corrupt.

    mmengine 0.10.7 deletes the outdated checkpoint *before* writing the new one, writes the
    new one in place, and then points ``last_checkpoint`` at it. A job killed during the
    write (a pre-emption, a full disk) therefore leaves a truncated ``epoch_N.pth`` and,
    with ``max_keep_ckpts=1``, no good checkpoint at all. Here, on a local disk:

    1. the checkpoint is written to a hidden ``.epoch_N.pth.partial`` and fsync'ed;
    2. it is renamed to ``epoch_N.pth`` (atomic), then ``last_checkpoint`` is rewritten the
       same way, so the resume pointer never names a partial file;
    3. only then is the outdated checkpoint deleted.

    Other storage backends keep mmengine's behaviour. Arguments are ``CheckpointHook``'s.
    """

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        if not isinstance(self.file_backend, LocalBackend):
            return super()._save_checkpoint_with_step(runner, step, meta)
        outdated = None
        # The bookkeeping is mmengine's (the list is saved inside the checkpoint); only the
        # deletion waits until the new file is in place.
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids
                                            and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        filename = self.filename_tmpl.format(step)
        self.last_ckpt = osp.join(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        partial = f'.{filename}.partial'
        runner.save_checkpoint(
            self.out_dir, partial, self.file_client_args, save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler, meta=meta, by_epoch=self.by_epoch,
            backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return
        _replace_atomically(osp.join(self.out_dir, partial), self.last_ckpt)
        pointer = osp.join(runner.work_dir, 'last_checkpoint')
        with open(pointer + '.partial', 'w') as f:
            f.write(self.last_ckpt)
        _replace_atomically(pointer + '.partial', pointer)
        if outdated is not None:
            old = osp.join(self.out_dir, self.filename_tmpl.format(outdated))
            if osp.isfile(old):
                os.remove(old)
