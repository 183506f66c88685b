"""Which checkpoint ``--resume`` continues from, and whether it can.

mmengine reads ``WORK_DIR/last_checkpoint`` relative to the current directory and fails on
an unusable file with a bare ``KeyError`` or a zip error. Here the pointer is read in the
work dir, the target is checked before loading, and auto-resume falls back to the previous
good checkpoint. See docs/reliability.md.
"""
import logging
import os
import os.path as osp
import re
from typing import List, Optional

from mmengine.logging import print_log

from .errors import CheckpointError, NotATrainingCheckpointError
from .safe_loading import read_checkpoint

POINTER = 'last_checkpoint'
# The names mmengine's CheckpointHook gives its checkpoints (filename_tmpl's defaults).
_STEP_NAME = re.compile(r'^(epoch|iter)_(\d+)\.pth$')


def check_training_checkpoint(filename: str) -> None:
    """Raise a :class:`CheckpointError` naming the problem unless ``filename`` is a training
    checkpoint that mmengine can resume from (opened memory-mapped: cheap to check)."""
    checkpoint = read_checkpoint(filename, map_location='cpu', mmap=True)
    problems = []
    if not isinstance(checkpoint, dict):
        problems.append(f'it holds a {type(checkpoint).__name__}, not a dict')
    else:
        meta = checkpoint.get('meta')
        if not isinstance(meta, dict):
            problems.append("it has no 'meta' (epoch and iteration)")
        elif not {'epoch', 'iter'} <= set(meta):
            problems.append("its 'meta' has no epoch and iteration")
        if 'message_hub' not in checkpoint:
            problems.append("it has no 'message_hub' (the logged history)")
        if not isinstance(checkpoint.get('state_dict'), dict):
            problems.append("it has no 'state_dict' (the weights)")
    if problems:
        found = (f' Its top-level keys: {_show(sorted(map(str, checkpoint)))}.'
                 if isinstance(checkpoint, dict) else '')
        raise NotATrainingCheckpointError(
            f'Cannot resume from {filename}: it is not an mmengine training checkpoint '
            f'({"; ".join(problems)}).{found} --resume continues a run from a checkpoint '
            'that tools/train.py saved (WORK_DIR/epoch_N.pth; --resume alone takes the latest '
            'one in the work dir). To start a new run from these weights instead, drop '
            f'--resume and pass --cfg-options load_from={filename}.')


def read_last_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint that ``work_dir/last_checkpoint`` names (not checked to exist), or None.

    A relative pointer is relative to ``work_dir``; an absolute one that leads out of it
    gives way to the same-named file inside it (the work dir was moved or copied).
    """
    pointer = osp.join(work_dir, POINTER)
    if not osp.isfile(pointer):
        return None
    with open(pointer) as f:
        named = f.read().strip()
    if not named:
        return None
    if not osp.isabs(named):
        return osp.normpath(osp.join(work_dir, named))
    if _is_inside(named, work_dir):
        return named
    local = osp.join(work_dir, osp.basename(named))
    if osp.isfile(local):
        if local != named:
            print_log(f'{pointer} names {named}, outside this work dir (was the work dir '
                      f'moved or copied?); resuming from {local}, the file of that name '
                      'here.', logger='current', level=logging.WARNING)
        return local
    # A checkpoint kept outside the work dir (CheckpointHook's out_dir) is still found.
    return named if osp.isfile(named) else local


def find_resume_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint auto-resume continues from, or None for a new run.

    The one ``last_checkpoint`` names or, if that is unusable, the newest older good one of
    the run, with a warning (the bad file is kept); :class:`CheckpointError` if none is good.
    """
    target = read_last_checkpoint(work_dir)
    if target is None:
        return None
    try:
        check_training_checkpoint(target)
        return target
    except CheckpointError as error:
        for candidate in _earlier_checkpoints(target, work_dir):
            try:
                check_training_checkpoint(candidate)
            except CheckpointError:
                continue
            print_log(f'{error} Auto-resume falls back to the previous good checkpoint, '
                      f'{candidate}. {target} is not deleted (SafeCheckpointHook renames it '
                      'to *.previous when this run saves that epoch again).',
                      logger='current', level=logging.WARNING)
            return candidate
        raise type(error)(
            f'{error} Auto-resume found no earlier good checkpoint in {work_dir} either. '
            'Resume from a checkpoint you know is good with --resume PATH, or train afresh '
            'in a new work dir (this one keeps its files).') from None


def _earlier_checkpoints(target: str, work_dir: str) -> List[str]:
    """Checkpoints of the run that are older than ``target``, newest first."""
    match = _STEP_NAME.match(osp.basename(target))
    found = {}
    for folder in dict.fromkeys([osp.dirname(target), work_dir]):
        if not osp.isdir(folder):
            continue
        for name in os.listdir(folder):
            step = _STEP_NAME.match(name)
            if step is None or osp.join(folder, name) == target:
                continue
            if match and (step[1] != match[1] or int(step[2]) >= int(match[2])):
                continue
            found.setdefault(name, (int(step[2]), osp.join(folder, name)))
    return [path for _, path in sorted(found.values(), reverse=True)]


def _is_inside(path: str, folder: str) -> bool:
    path, folder = osp.realpath(path), osp.realpath(folder)
    return osp.commonpath([path, folder]) == folder


def _show(keys: List[str], limit: int = 8) -> str:
    shown = ', '.join(keys[:limit])
    return shown + (f' ... ({len(keys)} in all)' if len(keys) > limit else '') or 'none'
