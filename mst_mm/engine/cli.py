"""Command-line plumbing shared by our tools: checked ``--cfg-options`` and clean errors.

``--cfg-options`` keeps mmengine's semantics (a new key is added), but mmengine's
``DictAction`` fails on ``KEY`` without ``=`` with a traceback and takes ``KEY=[0.1`` as a
string: both are refused here by name, and an added key is named in a warning.
"""
import argparse
import difflib
import glob
import os.path as osp
import re
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist
from mmengine.config import Config, DictAction

from .errors import ConfigOptionError, NotATestConfigError, UserInputError

# Dot-separated names or list indices.
_KEY = re.compile(r'^[A-Za-z_]\w*(\.\w+)*$')
_FORM = ('each option is KEY=VALUE with no spaces around "=", e.g. model.mask_cfg.p=0.1; '
         'a list is KEY=[a,b] or KEY=a,b, a tuple KEY=(a,b), nested KEY="[(a,b),(c,d)]" '
         '(quote the option for the shell)')


def cfg_option_syntax_error(option: str) -> Optional[str]:
    """What is wrong with the form of one ``KEY=VALUE`` option, in words, or None."""
    if '=' not in option:
        return f'no "=" in {option!r}: {_FORM}'
    key, value = option.split('=', 1)
    if not _KEY.match(key):
        return (f'{key!r} is not a config key: keys are names joined by dots '
                '(model.mask_cfg.p), and list items are numbers (custom_hooks.0.start)')
    stack, pairs = [], {')': '(', ']': '['}
    for char in value:
        if char in '([':
            stack.append(char)
        elif char in ')]' and (not stack or stack.pop() != pairs[char]):
            return f'unbalanced brackets in the value of {key}: {value!r}; {_FORM}'
    if stack:
        return f'unbalanced brackets in the value of {key}: {value!r}; {_FORM}'
    for quote in '\'"':
        if value.count(quote) % 2:
            return f'unmatched {quote} in the value of {key}: {value!r}; {_FORM}'
    return None


class CheckedDictAction(DictAction):
    """mmengine's ``DictAction`` that refuses a malformed ``KEY=VALUE`` by name (argparse's
    usage error, status 2); keys are checked later, against the config."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Optional[Sequence[str]], option_string: Optional[str] = None) -> None:
        for option in values or []:
            problem = cfg_option_syntax_error(option)
            if problem is not None:
                parser.error(f'{option_string or "--cfg-options"}: {problem}')
        super().__call__(parser, namespace, values, option_string)


def add_cfg_options_argument(parser: argparse.ArgumentParser) -> None:
    """Add our tools' ``--cfg-options`` (checked syntax, checked keys) to ``parser``."""
    parser.add_argument(
        '--cfg-options', nargs='+', action=CheckedDictAction, metavar='KEY=VALUE',
        help='override settings of the config, e.g. model.mask_cfg.p=0.05. A list is '
        'KEY=[a,b] or KEY=a,b, a tuple KEY=(a,b), nested KEY="[(a,b),(c,d)]" (quotes '
        'needed, no spaces). As in mmengine, a KEY the config does not set is added (with a '
        'warning naming the closest existing key).')


def check_cfg_options(cfg: Config, options: Dict[str, Any]) -> List[str]:
    """One line per key of ``options`` that ``cfg`` does not set, with the closest existing key.

    Raises:
        ConfigOptionError: A key that cannot be merged: a list index out of range, or a key
            below a value that is not a dict.
    """
    added, problems = [], []
    for key, value in options.items():
        kind, text = _key_problem(cfg, key)
        if kind == 'added':
            added.append(f'{key}={value!r}: {text}')
        elif kind == 'error':
            problems.append(f'{key}={value!r}: {text}')
    if problems:
        raise ConfigOptionError('Bad --cfg-options key{}:\n  {}'.format(
            's' if len(problems) > 1 else '', '\n  '.join(problems)))
    return added


def merge_cfg_options(cfg: Config, options: Optional[Dict[str, Any]]) -> Config:
    """``cfg.merge_from_dict(options)`` in place, warning for each key the config did not set."""
    if options:
        added = check_cfg_options(cfg, options)
        if added:
            warnings.warn('--cfg-options adds keys that the config does not set (check for a '
                          'typo):\n  ' + '\n  '.join(added), stacklevel=2)
        cfg.merge_from_dict(options)
    return cfg


def _key_problem(cfg: Config, key: str) -> Tuple[Optional[str], str]:
    """``(None, '')`` for an existing key, ``('added', why)`` for a new one, ``('error', why)``
    for one that cannot be merged."""
    node: Any = cfg
    parts = key.split('.')
    for depth, part in enumerate(parts):
        parent = '.'.join(parts[:depth]) or 'the config'
        if isinstance(node, (list, tuple)):
            if not part.isdigit() or int(part) >= len(node):
                return 'error', (f'{parent} is a list of {len(node)} items: address one by its '
                                 f'index, 0 to {len(node) - 1} (e.g. {parent}.0.KEY=VALUE)')
            node = node[int(part)]
        elif isinstance(node, (dict, Config)):
            if part in node:
                node = node[part]
                continue
            if part == '_delete_':
                return None, ''
            keys = sorted(str(k) for k in node)
            close = difflib.get_close_matches(part, keys, n=1)
            hint = f' (did you mean {".".join(parts[:depth] + close)!r}?)' if close else ''
            return 'added', (f'{parent} has no key {part!r}{hint}. Its keys are: '
                             f'{_listing(keys)}.')
        else:
            return 'error', (f'{parent} is {node!r} ({type(node).__name__}), not a dict: it has '
                             f'no key {part!r}')
    return None, ''


def _listing(keys: List[str], limit: int = 40) -> str:
    return ', '.join(keys[:limit]) + (f' ... ({len(keys)} in all)' if len(keys) > limit else '')


# Where the evaluations of a pretrained checkpoint live, and how each is started.
_REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
_EVALUATIONS = (
    ('k-NN (no training)', 'knn',
     'python tools/analysis/knn_eval.py {config} {checkpoint}'),
    ('linear probe', 'classification',
     'python tools/train.py {config} --cfg-options '
     'model.backbone.init_cfg.checkpoint={checkpoint}'),
    ('detection (mmdet)', 'mmdetection',
     'python tools/model_converters/mst2downstream.py {checkpoint} {pretrained} '
     '--target mmdet, then python tools/train.py {config}'),
    ('segmentation (mmseg)', 'mmsegmentation',
     'python tools/model_converters/mst2downstream.py {checkpoint} {pretrained} '
     '--target mmseg, then python tools/train.py {config}'),
)
# The downstream configs read the converted backbone from `pretrained = '...'`.
_PRETRAINED = re.compile(r"^pretrained = '([^']+)'", re.MULTILINE)
_BACKBONE_TOKENS = ('deit-s', 'swin-t', 'vit-tiny', 'vit-b', 'vit-s')


def check_test_config(cfg: Config, config_path: str, checkpoint: str) -> None:
    """Refuse a config that ``tools/test.py`` cannot run, saying what to run instead.

    k-NN configs go to the one k-NN entry point, ``tools/analysis/knn_eval.py``. A
    pretraining config has no test split (mmengine fails with "``self._test_loop`` should
    not be None"): the message lists the evaluation configs of the same backbone, with the
    commands.

    Raises:
        NotATestConfigError: the config has no ``test_dataloader`` or ``test_evaluator``, or
            is a k-NN config, which ``tools/analysis/knn_eval.py`` runs.
    """
    if (cfg.get('test_cfg') or {}).get('type') == 'KNNTestLoop':
        raise NotATestConfigError(
            f'{config_path} is a k-NN config: run it with the k-NN tool, python '
            f'tools/analysis/knn_eval.py {config_path} {checkpoint} (it prints the table and '
            'takes --weights, --ks and --out; torchrun ... --launcher pytorch for several '
            'processes).')
    missing = [key for key in ('test_dataloader', 'test_evaluator') if cfg.get(key) is None]
    if not missing:
        return
    model = cfg.get('model') or {}
    if model.get('type') != 'MST':
        raise NotATestConfigError(
            f'{config_path} has no {" or ".join(missing)}: tools/test.py evaluates configs '
            'with a test split and a metric, such as the k-NN and linear-probe configs '
            'under configs/benchmarks/.')
    name = osp.basename(config_path)
    token = next((t for t in _BACKBONE_TOKENS if t in name), None)
    found = [(title, command, sorted(glob.glob(
        osp.join(_REPO, 'configs', 'benchmarks', folder, '*.py'))))
        for title, folder, command in _EVALUATIONS]
    # The benchmark configs of the same backbone, if the names tell; otherwise all of them.
    same = [(title, command, [c for c in configs if token in osp.basename(c)])
            for title, command, configs in found] if token else []
    lines = [f'  {title}: ' + command.format(config=osp.relpath(config, _REPO),
                                             checkpoint=checkpoint,
                                             pretrained=_pretrained_path(config))
             for title, command, configs in (same if any(c for *_, c in same) else found)
             for config in configs]
    raise NotATestConfigError(
        f'{config_path} is a pretraining config (model type MST): it has no test split or '
        'metric, so tools/test.py has nothing to evaluate. Evaluate the pretrained backbone '
        f'of {checkpoint} instead (the configs hold the data paths and settings):\n'
        + '\n'.join(lines)
        + f'\nTo continue pretraining from it: python tools/train.py {config_path} '
        f'--resume {checkpoint}')


def _pretrained_path(config: str) -> str:
    with open(config) as f:
        found = _PRETRAINED.search(f.read())
    return found[1] if found else 'BACKBONE.pth'


def run_tool(main: Callable[[], Any]) -> None:
    """Run a tool's ``main()``; a :class:`UserInputError` becomes ``TOOL: error: MESSAGE``
    on stderr and status 2 (argparse's form). Other exceptions keep their traceback: bugs."""
    try:
        main()
    except UserInputError as error:
        print(f'{osp.basename(sys.argv[0])}: error: {error}', file=sys.stderr)
        raise SystemExit(2) from None
    close_process_group()


def close_process_group() -> None:
    """Let every rank finish, then close the process group before the interpreter exits.

    A gloo group left to the interpreter's teardown can abort a finished run ("terminate
    called without an active exception"). Only after a successful ``main()``: a barrier
    after one rank's error would hang the others.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
