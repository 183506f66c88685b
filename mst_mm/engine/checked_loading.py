"""Weight loading that refuses to leave a model silently at its random initialisation.

mmengine loads ``load_from`` and ``init_cfg=dict(type='Pretrained')`` with ``strict=False``
and only logs unmatched keys, so a checkpoint of another model "loads" and leaves every
weight random. See docs/reliability.md.
"""
import logging
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner import Runner
from mmpretrain.registry import RUNNERS
from mmpretrain.utils import get_ori_model

from .errors import IncompleteCheckpointError
from .safe_loading import load_checkpoint_safely

_SIZE_MISMATCH = re.compile(r'size mismatch for (\S+): copying a param with shape (.+?) from '
                            r'checkpoint, the shape in current model is (.+?)\.?$')
_COPY_ERROR = re.compile(r'While copying the parameter named "([^"]+)"')


@dataclass
class LoadReport:
    """What :func:`load_state_dict_checked` loaded: expected keys (BN counters left out),
    missing and unexpected keys, and keys whose tensor could not be copied, with why."""
    expected: List[str]
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: Dict[str, str] = field(default_factory=dict)

    @property
    def not_loaded(self) -> List[str]:
        """Expected keys left at their initial value."""
        return sorted(set(self.missing) | set(self.mismatched))

    @property
    def num_loaded(self) -> int:
        return len(self.expected) - len(self.not_loaded)


def load_state_dict_checked(module: nn.Module, state_dict: dict) -> LoadReport:
    """Load ``state_dict`` into ``module`` as mmengine does (non-strict) and report the result.

    mmengine's recursion, so load hooks that rename or resize weights (a resized position
    embedding) run before the keys are judged; unlike mmengine's, it returns what it could
    not load instead of only logging it. Model wrappers are unwrapped.
    """
    module = get_ori_model(module)
    report = LoadReport(expected=[k for k in module.state_dict()
                                  if 'num_batches_tracked' not in k])
    missing, unexpected, errors = [], [], []
    metadata = getattr(state_dict, '_metadata', None)
    state_dict = OrderedDict(state_dict)
    if metadata is not None:
        state_dict._metadata = metadata

    def load(child_module: nn.Module, local_state_dict: dict, prefix: str = '') -> None:
        local_metadata = {} if metadata is None else metadata.get(prefix[:-1], {})
        child_module._load_from_state_dict(local_state_dict, prefix, local_metadata, True,
                                           missing, unexpected, errors)
        for name, child in child_module._modules.items():
            if child is not None:
                child_prefix = f'{prefix}{name}.'
                load(child, {k: v for k, v in local_state_dict.items()
                             if k.startswith(child_prefix)}, child_prefix)
        incompatible = nn.modules.module._IncompatibleKeys(missing, unexpected)
        for hook in child_module._load_state_dict_post_hooks.values():
            hook(child_module, incompatible)

    load(module, state_dict)
    report.missing = [k for k in missing if 'num_batches_tracked' not in k]
    report.unexpected = list(unexpected)
    for message in errors:
        match = _SIZE_MISMATCH.search(message) or _COPY_ERROR.search(message)
        key = match[1] if match else '?'
        report.mismatched[key] = (
            f'{_shape(match[2])} in the checkpoint and {_shape(match[3])} in the model'
            if match and match.re is _SIZE_MISMATCH else message)
    return report


def _shape(text: str) -> str:
    """'torch.Size([4, 2])' -> '(4, 2)'."""
    return re.sub(r'torch\.Size\(\[(.*?)\]\)', r'(\1)', text)


def raise_if_incomplete(report: LoadReport, source: str, what: str, allow_partial: bool,
                        fix: str, partial_hint: str = '') -> None:
    """Raise :class:`IncompleteCheckpointError` if ``report`` left weights of ``what``
    (named in the message, with ``source``, ``fix`` and ``partial_hint``) at their initial
    values; with ``allow_partial``, only warn, unless nothing at all was loaded."""
    not_loaded = report.not_loaded
    if not not_loaded:
        return
    total = len(report.expected)
    summary = _summarise(not_loaded, report)
    if report.num_loaded == 0:
        found = _show(report.unexpected) if report.unexpected else 'no tensors'
        raise IncompleteCheckpointError(
            f'{source} provides none of the {total} weights of {what}, which would stay '
            f'randomly initialised: missing {summary}. The file holds {found}.'
            f'{_prefix_hint(report)} It is not a checkpoint of this model. {fix}')
    message = (f'{source} provides {report.num_loaded} of the {total} weights of {what}; '
               f'not loaded, so left randomly initialised: {summary}.{_prefix_hint(report)}')
    if not allow_partial:
        raise IncompleteCheckpointError(f'{message} {fix} {partial_hint}'.rstrip())
    print_log(f'{message} Partial load allowed: going on.', logger='current',
              level=logging.WARNING)


def _summarise(keys: Sequence[str], report: LoadReport) -> str:
    """'backbone: 52 of 52 tensors (cls_token, pos_embed, ...)', by top-level module."""
    def head(key: str) -> str:
        return key.split('.')[0] if '.' in key else ''

    sizes = Counter(head(k) for k in report.expected)
    groups: Dict[str, List[str]] = {}
    for key in keys:
        groups.setdefault(head(key), []).append(key[len(head(key)) + 1:] if head(key) else key)
    text = '; '.join(f'{name or "top level"}: {len(names)} of {sizes[name]} tensors '
                     f'({_show(names, 5, count=False)})' for name, names in groups.items())
    if report.mismatched:
        text += '; of these, shapes differ: ' + ', '.join(
            f'{k} is {why}' for k, why in list(report.mismatched.items())[:3])
    return text


def _prefix_hint(report: LoadReport) -> str:
    """Say so when the file has the missing weights under another prefix."""
    missing, unexpected = set(report.missing), set(report.unexpected)
    extra, lacking = Counter(), Counter()
    for key in unexpected:
        parts = key.split('.')
        for i in range(1, min(len(parts), 5)):
            if '.'.join(parts[i:]) in missing:
                extra['.'.join(parts[:i]) + '.'] += 1
    for key in missing:
        parts = key.split('.')
        for i in range(1, min(len(parts), 5)):
            if '.'.join(parts[i:]) in unexpected:
                lacking['.'.join(parts[:i]) + '.'] += 1
    if extra:
        prefix, count = extra.most_common(1)[0]
        return (f' {count} of the missing weights are in the file under the prefix '
                f'{prefix!r}.')
    if lacking:
        prefix, count = lacking.most_common(1)[0]
        return (f' {count} of the missing weights are in the file without the prefix '
                f'{prefix!r}.')
    return ''


def _show(keys: Sequence[str], limit: int = 6, count: bool = True) -> str:
    keys = sorted(keys)
    more = f' ... ({len(keys)} keys in all)' if count else ', ...'
    return ', '.join(keys[:limit]) + (more if len(keys) > limit else '')


def state_dict_of(checkpoint: Any, source: str) -> dict:
    """The state dict inside a loaded checkpoint (mmengine's rule: ``'state_dict'`` if any)."""
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) \
        else checkpoint
    if not isinstance(state_dict, dict):
        raise IncompleteCheckpointError(
            f'{source} holds a {type(state_dict).__name__}, not a state dict: it provides no '
            'weights. Give a checkpoint saved by tools/train.py or a torch.save(state_dict).')
    return state_dict


def _revised(state_dict: dict, revise_keys: Sequence[Tuple[str, str]]) -> dict:
    metadata = getattr(state_dict, '_metadata', OrderedDict())
    for pattern, replacement in revise_keys:
        state_dict = OrderedDict((re.sub(pattern, replacement, k), v)
                                 for k, v in state_dict.items())
    state_dict._metadata = metadata
    return state_dict


@WEIGHT_INITIALIZERS.register_module(name='CheckedPretrained')
class CheckedPretrainedInit(PretrainedInit):
    """mmengine's ``Pretrained`` initialiser, weights-only, refusing missing weights.

    A name of its own in mmengine's root registry, so ``'Pretrained'`` stays mmengine's for
    every other config in the process.

    Args:
        checkpoint (str): The checkpoint file.
        prefix (str, optional): Load only the keys under this prefix (e.g.
            ``'teacher.module.0.'`` for an MST checkpoint's EMA teacher), without it.
        map_location (str): Defaults to ``'cpu'``.
        allow_partial (bool): Accept a checkpoint that provides only some of the module's
            weights (a warning names the rest). Defaults to False.
    """

    def __init__(self, checkpoint: str, prefix: Optional[str] = None,
                 map_location: str = 'cpu', allow_partial: bool = False) -> None:
        super().__init__(checkpoint, prefix=prefix, map_location=map_location)
        self.allow_partial = allow_partial

    def __call__(self, module: nn.Module) -> None:
        what = f"the {type(module).__name__} (init_cfg type='CheckedPretrained')"
        advice = ("Check the init_cfg's checkpoint and prefix (prefix='teacher.module.0.' "
                  'selects the EMA teacher of an MST checkpoint).')
        print_log(f'load {self.prefix or "model"} from: {self.checkpoint}', logger='current')
        checkpoint = load_checkpoint_safely(self.checkpoint, self.map_location)
        state_dict = state_dict_of(checkpoint, self.checkpoint)
        if self.prefix is None:
            state_dict = _revised(state_dict, [(r'^module\.', '')])
        else:
            prefix = self.prefix if self.prefix.endswith('.') else self.prefix + '.'
            selected = {k[len(prefix):]: v for k, v in state_dict.items()
                        if k.startswith(prefix)}
            if not selected:
                heads = sorted({k.split('.')[0] + ('.' if '.' in k else '') for k in state_dict})
                raise IncompleteCheckpointError(
                    f'{self.checkpoint} has no weights under the prefix {prefix!r} that '
                    f'{what} asks for; its keys start with {_show(heads) or "nothing"}. '
                    f'{advice}')
            state_dict = selected
        report = load_state_dict_checked(module, state_dict)
        raise_if_incomplete(report, self.checkpoint, what, self.allow_partial, advice,
                            'To load what matches and keep the rest random, add '
                            'allow_partial=True to the init_cfg.')
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())


@RUNNERS.register_module()
class CheckedRunner(Runner):
    """mmengine's ``Runner`` whose ``load_from`` and resume are weights-only and must provide
    every weight of the model (``allow_partial_load=True`` in the config relaxes that).

    Selected by ``runner_type='CheckedRunner'`` in ``configs/_base_/default_runtime.py``.
    """

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module\.', '')]) -> dict:  # noqa: B006
        """``Runner.load_checkpoint``, weights-only and checked."""
        checkpoint = load_checkpoint_safely(filename, map_location)
        # mmengine's order: hooks may rewrite the checkpoint before it reaches the model.
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = get_ori_model(self.model)
        state_dict = _revised(state_dict_of(checkpoint, filename), revise_keys)
        report = load_state_dict_checked(model, state_dict)
        allow_partial = bool(self.cfg.get('allow_partial_load', False))
        raise_if_incomplete(
            report, filename, f'this config\'s {type(model).__name__}', allow_partial,
            'Give a checkpoint of this config\'s model: an MST training checkpoint '
            '(WORK_DIR/epoch_N.pth) or a state dict that the model accepts.',
            '--allow-partial (allow_partial_load=True in the config) loads what matches and '
            'leaves the rest randomly initialised.')
        if strict and report.unexpected:
            raise IncompleteCheckpointError(
                f'{filename} has keys that {type(model).__name__} does not: '
                f'{_show(report.unexpected)} (strict loading).')
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint


def build_runner(cfg: Config) -> Runner:
    """The config's ``runner_type`` (``CheckedRunner`` in ours), or mmengine's ``Runner``:
    mmpretrain's ``tools/train.py`` rule."""
    return RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
