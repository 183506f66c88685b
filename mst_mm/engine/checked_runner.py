"""mmengine's Runner and ``Pretrained`` initialiser with this project's checkpoint rules: every
load weights-only (``safe_loading``), every save readable by torch's own weights-only loader
(``plain_checkpoint``), and no weight left random without saying so."""
import logging
import re
from collections import Counter, OrderedDict
from typing import Any, Dict, List, Optional, Sequence

import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner import Runner
from mmpretrain.registry import RUNNERS
from mmpretrain.utils import get_ori_model

from mst_mm.errors import CheckpointError, some_keys

from .plain_checkpoint import to_plain
from .safe_loading import read_checkpoint

__all__ = ['CheckedPretrainedInit', 'CheckedRunner', 'build_runner', 'check_training_checkpoint',
           'load_checked', 'state_dict_of']
_SIZE_MISMATCH = re.compile(r'size mismatch for (\S+): .*?Size\(\[(.*?)\]\).*?Size\(\[(.*?)\]\)')


def check_training_checkpoint(filename: str) -> None:
    """Refuse a ``--resume`` file that is no training checkpoint (mmengine: a bare ``KeyError``)."""
    checkpoint = read_checkpoint(filename, map_location='cpu', mmap=True)
    if not isinstance(checkpoint, dict):
        problems, found = [f'it holds a {type(checkpoint).__name__}, not a dict'], ''
    else:
        meta, problems = checkpoint.get('meta'), []
        found = f' Its top-level keys: {", ".join(sorted(map(str, checkpoint))[:8]) or "none"}.'
        if not isinstance(meta, dict):
            problems.append("it has no 'meta' (epoch and iteration)")
        elif not {'epoch', 'iter'} <= set(meta):
            problems.append("its 'meta' has no epoch and iteration")
        if 'message_hub' not in checkpoint:
            problems.append("it has no 'message_hub' (the logged history)")
        if not isinstance(checkpoint.get('state_dict'), dict):
            problems.append("it has no 'state_dict' (the weights)")
    if problems:
        raise CheckpointError(
            f'Cannot resume from {filename}: it is not an mmengine training checkpoint '
            f'({"; ".join(problems)}).{found} --resume continues a run that tools/train.py saved '
            '(WORK_DIR/epoch_N.pth or latest.pth; --resume alone takes the newest). To start a new '
            f'run from these weights, drop --resume and pass --cfg-options load_from={filename}.')


def load_checked(module: nn.Module, state_dict: dict, source: str, what: str, fix: str,
                 allow_partial: bool = False, partial_hint: str = '', strict: bool = False):
    """``module.load_state_dict``, refusing weights of ``what`` left random (``allow_partial``:
    only if none loaded), a shape mismatch or (``strict``) an unexpected key, by name."""
    expected = [k for k in module.state_dict() if not k.endswith('num_batches_tracked')]
    try:
        result = module.load_state_dict(state_dict, strict=strict)
    except RuntimeError as error:  # torch raises on a shape mismatch even when not strict
        shapes = '; '.join(f'{key} is ({theirs}) in the checkpoint and ({ours}) in the model'
                           for key, theirs, ours in _SIZE_MISMATCH.findall(str(error))[:3])
        raise CheckpointError(f'{source} does not fit {what}: {shapes or error}. {fix}') from None
    missing = sorted(k for k in result.missing_keys if not k.endswith('num_batches_tracked'))
    if not missing:
        return
    sizes = Counter(k.partition('.')[0] if '.' in k else '' for k in expected)
    groups: Dict[str, List[str]] = {}  # missing keys by top-level module
    for head, tail in (k.split('.', 1) if '.' in k else ('', k) for k in missing):
        groups.setdefault(head, []).append(tail)
    summary = '; '.join(f'{name or "top level"}: {len(names)} of {sizes[name]} tensors '
                        f'({some_keys(sorted(names), 5)})' for name, names in groups.items())
    held = some_keys(sorted(result.unexpected_keys), 6) or 'no tensors'
    if len(missing) == len(expected):
        raise CheckpointError(f'{source} provides none of the {len(expected)} weights of {what}, '
                              f'which would stay randomly initialised: missing {summary}. The '
                              f'file holds {held}. It '
                              f'is not a checkpoint of this model. {fix}')
    message = (f'{source} provides {len(expected) - len(missing)} of the {len(expected)} weights '
               f'of {what}; not loaded, so left randomly initialised: {summary}.')
    if not allow_partial:
        raise CheckpointError(f'{message} {fix} {partial_hint}'.rstrip())
    print_log(f'{message} Partial load allowed: going on.', logger='current', level=logging.WARNING)


def state_dict_of(checkpoint: Any, source: str, revise_keys: Sequence = ()) -> dict:
    """The state dict in a loaded checkpoint (``'state_dict'`` if any), keys revised."""
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else 0
    if not isinstance(state_dict, dict):
        raise CheckpointError(f'{source} holds no state dict: it provides no weights.')
    revised = OrderedDict(state_dict)
    for pattern, replacement in revise_keys:
        revised = OrderedDict((re.sub(pattern, replacement, k), v) for k, v in revised.items())
    revised._metadata = getattr(state_dict, '_metadata', OrderedDict())  # module versions
    return revised


@WEIGHT_INITIALIZERS.register_module(name='CheckedPretrained')
class CheckedPretrainedInit(PretrainedInit):
    """mmengine's ``Pretrained``, weights-only, refusing a partial load unless ``allow_partial``."""

    def __init__(self, checkpoint: str, prefix: Optional[str] = None,
                 map_location: str = 'cpu', allow_partial: bool = False) -> None:
        super().__init__(checkpoint, prefix=prefix, map_location=map_location)
        self.allow_partial = allow_partial

    def __call__(self, module: nn.Module) -> None:
        what = f"the {type(module).__name__} (init_cfg type='CheckedPretrained')"
        fix = "Check the init_cfg's checkpoint and prefix ('teacher.module.0.': MST's teacher)."
        state_dict = state_dict_of(read_checkpoint(self.checkpoint, self.map_location),
                                    self.checkpoint, [] if self.prefix else [(r'^module\.', '')])
        if self.prefix:
            prefix = self.prefix.rstrip('.') + '.'
            selected = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
            if not selected:
                raise CheckpointError(f'{self.checkpoint} has no weights under the prefix '
                                      f'{prefix!r}; its keys: '
                                      f'{some_keys(sorted(state_dict), 6)}. {fix}')
            state_dict = selected
        load_checked(module, state_dict, self.checkpoint, what, fix, self.allow_partial,
                     'To load what matches and keep the rest random, add allow_partial=True '
                     'to the init_cfg.')
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())


@RUNNERS.register_module()
class CheckedRunner(Runner):
    """mmengine's ``Runner`` whose loads are weights-only and must provide every weight, and
    whose saves torch's own weights-only loader reads with nothing added."""

    def call_hook(self, fn_name: str, **kwargs) -> None:
        super().call_hook(fn_name, **kwargs)
        if fn_name == 'before_save_checkpoint':
            # After every hook has added its part, just before mmengine saves the dict.
            checkpoint = kwargs['checkpoint']
            checkpoint.update(to_plain(checkpoint, 'the checkpoint'))

    def load_checkpoint(self, filename: str, map_location: Any = 'cpu', strict: bool = False,
                        revise_keys: list = [(r'^module\.', '')]) -> dict:  # noqa: B006
        checkpoint = read_checkpoint(filename, map_location)
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)  # may rewrite it, first
        model = get_ori_model(self.model)
        load_checked(model, state_dict_of(checkpoint, filename, revise_keys), filename,
                     f"this config's {type(model).__name__}",
                     "Give a checkpoint of this config's model: an MST training checkpoint "
                     '(WORK_DIR/epoch_N.pth) or a state dict that the model accepts.',
                     bool(self.cfg.get('allow_partial_load', False)),
                     '--allow-partial (allow_partial_load=True in the config) loads what '
                     'matches and leaves the rest randomly initialised.', strict)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint


def build_runner(cfg: Config) -> Runner:
    """The config's ``runner_type`` (``CheckedRunner`` in ours), else mmengine's ``Runner``."""
    return RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
