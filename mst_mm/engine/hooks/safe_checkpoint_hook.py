"""Checkpoints that a kill during the save cannot take away, in a work dir that can move."""
import logging
import os
import os.path as osp

from mmengine.dist import is_main_process
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmpretrain.registry import HOOKS

from ..resume import POINTER, find_resume_checkpoint


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

    A checkpoint name that exists already from an earlier attempt (a run resumed from an
    older checkpoint saves those epochs again) is not written over: the earlier file is
    renamed to ``epoch_N.pth.previous`` first.

    ``last_checkpoint`` holds the path relative to the work dir, so a moved or copied work
    dir resumes from its own checkpoints; auto-resume reads it (and older absolute pointers)
    through :func:`mst_mm.engine.resume.find_resume_checkpoint`, also when the Runner is
    used without ``tools/train.py``.

    Other storage backends keep mmengine's behaviour. Arguments are ``CheckpointHook``'s.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The checkpoints saved by this process, which it may replace (a best-checkpoint
        # update saves the same step twice); any other existing file is kept aside.
        self._written = set()

    def before_run(self, runner) -> None:
        """Resolve auto-resume's ``last_checkpoint`` in the work dir.

        Args:
            runner (Runner): The runner.
        """
        super().before_run(runner)
        # mmengine's auto-resume would read the pointer relative to the current directory.
        # tools/train.py resolves it before building the Runner; this covers direct use.
        if getattr(runner, '_resume', False) and getattr(runner, '_load_from', None) is None:
            runner._load_from = find_resume_checkpoint(runner.work_dir)

    def before_train(self, runner) -> None:
        """mmengine's set-up, then keep a resumed best checkpoint's path in this work dir.

        Args:
            runner (Runner): The runner.
        """
        super().before_train(runner)
        # The best checkpoint's path comes from the resumed message hub. In a copied work
        # dir it names the original's file, which mmengine would delete when a new best
        # arrives: point it at the same-named file here instead.
        if getattr(self, 'best_ckpt_path', None):
            self.best_ckpt_path = self._rebased(self.best_ckpt_path)
        for key, path in getattr(self, 'best_ckpt_path_dict', {}).items():
            if path:
                self.best_ckpt_path_dict[key] = self._rebased(path)

    def _keep_earlier_file(self, path: str) -> None:
        # A run that resumed from an earlier checkpoint (by choice, or because auto-resume
        # skipped an unusable one) saves epochs that exist already; mmengine would write
        # over them. The earlier file is renamed aside instead, never lost.
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
        self._keep_earlier_file(self.last_ckpt)
        _replace_atomically(osp.join(self.out_dir, partial), self.last_ckpt)
        self._written.add(self.last_ckpt)
        pointer = osp.join(runner.work_dir, POINTER)
        with open(pointer + '.partial', 'w') as f:
            # Relative to the work dir, so that the pointer moves with it.
            f.write(osp.relpath(self.last_ckpt, runner.work_dir))
        _replace_atomically(pointer + '.partial', pointer)
        if outdated is not None:
            old = osp.join(self.out_dir, self.filename_tmpl.format(outdated))
            if osp.isfile(old):
                os.remove(old)
