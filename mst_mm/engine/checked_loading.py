"""Weight loading that refuses to leave a model silently at its random initialisation.

mmengine loads ``load_from`` checkpoints and ``init_cfg=dict(type='Pretrained')`` with
``strict=False`` and only logs the keys it could not match. A checkpoint of another model
(a ResNet for a ViT, a dict with unrelated keys) therefore "loads" without error and leaves
every weight random: a k-NN table or a linear probe is then computed from an untrained
backbone. Here a load must provide every weight of the module, or the user must ask for a
partial load; a load that provides nothing is always refused.
"""
import logging
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner import Runner
from mmpretrain.registry import RUNNERS

from .errors import IncompleteCheckpointError
from .safe_loading import load_checkpoint_safely

_SIZE_MISMATCH = re.compile(r'size mismatch for (\S+): copying a param with shape (.+?) from '
                            r'checkpoint, the shape in current model is (.+?)\.?$')
_COPY_ERROR = re.compile(r'While copying the parameter named "([^"]+)"')


@dataclass
class LoadReport:
    """What a :func:`load_state_dict_checked` call loaded and what it did not.

    Args:
        expected (list[str]): The module's state-dict keys (BN counters left out).
        missing (list[str]): Expected keys that the state dict did not have.
        unexpected (list[str]): Keys of the state dict that the module has no place for.
        mismatched (dict[str, str]): Expected keys whose tensor could not be copied (a
            different shape), with the reason.
    """
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
    """Load ``state_dict`` into ``module`` like mmengine (non-strict) and report the result.

    The recursion is mmengine's ``load_state_dict``: each module's own
    ``_load_from_state_dict`` and its load hooks run, so modules that rename or resize
    weights while loading (an MST checkpoint's teacher selected by ``FeatureEmbedder``, a
    position embedding resized by mmpretrain's ViT) are judged after they did so. Unlike
    mmengine's, it returns what it could not load instead of only logging it.

    Args:
        module (nn.Module): The module to load into (model wrappers are unwrapped).
        state_dict (dict): Tensors by key, relative to ``module``.

    Returns:
        LoadReport: Missing, unexpected and shape-mismatched keys.
    """
    if is_model_wrapper(module):
        module = module.module
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
    """Refuse a load that left weights of ``what`` at their initial values.

    Args:
        report (LoadReport): The result of :func:`load_state_dict_checked`.
        source (str): The checkpoint file, for the message.
        what (str): The module that was loaded, for the message (e.g. "the backbone").
        allow_partial (bool): Accept a load that provided some but not all weights (a
            warning lists what was left out). A load that provided none is refused anyway.
        fix (str): What the user can do, appended to the message.
        partial_hint (str): How to allow a partial load, appended when some weights loaded.

    Raises:
        IncompleteCheckpointError: Some (or all) weights were not loaded.
    """
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
    """The state dict inside a loaded checkpoint (mmengine's rule: ``'state_dict'`` if any).

    Args:
        checkpoint: What ``torch.load`` returned.
        source (str): The file, for the message.

    Returns:
        dict: Tensors by key.
    """
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
    """mmengine's ``Pretrained`` initialiser, weights-only, refusing a checkpoint with missing
    weights: ``init_cfg=dict(type='CheckedPretrained', checkpoint=..., prefix=...)``.

    Under a name of its own, in mmengine's root registry (so every scope finds it), so that
    mmengine's ``'Pretrained'`` stays what every other config in the process gets.
    ``MaskViT`` and ``MaskSwin`` skip their own re-initialisation after it as after
    ``'Pretrained'`` (mmpretrain's backbones know only that name).

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
        """Load the checkpoint into ``module`` and refuse it if weights are left out.

        Args:
            module (nn.Module): The module whose ``init_cfg`` this is.
        """
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
    """mmengine's ``Runner`` whose ``load_from`` must provide every weight of the model.

    ``tools/test.py`` and ``tools/analysis/knn_eval.py`` use it, so that evaluating a
    checkpoint of another model fails with the file and the missing weights named, instead
    of evaluating a randomly initialised backbone. Set ``allow_partial_load=True`` in the
    config (the tools' ``--allow-partial``) to accept a checkpoint that provides only some
    weights; one that provides none is refused anyway. Resuming goes through the same check.
    Every load is weights-only (:func:`load_checkpoint_safely`), which mmengine's training
    checkpoints pass. Our configs select it with ``runner_type='CheckedRunner'``
    (``configs/_base_/default_runtime.py``), which mmpretrain's ``tools/train.py`` honours.
    """

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module\.', '')]) -> dict:  # noqa: B006
        """Load ``filename`` into the model, as ``Runner.load_checkpoint`` but checked.

        Args:
            filename (str): The checkpoint.
            map_location (str | callable): Where to put the tensors. Defaults to ``'cpu'``.
            strict (bool): Also refuse keys that the model does not have.
            revise_keys (list): ``(pattern, replacement)`` applied to every key first.

        Returns:
            dict: The loaded checkpoint.
        """
        checkpoint = load_checkpoint_safely(filename, map_location)
        # mmengine's order: hooks may rewrite the checkpoint before it reaches the model.
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
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
