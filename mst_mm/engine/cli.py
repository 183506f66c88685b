"""Command-line plumbing shared by our tools: checked ``--cfg-options`` and clean errors.

mmengine's ``DictAction`` fails on ``KEY`` without ``=`` with Python's "not enough values
to unpack", takes ``KEY=[0.1`` as the string ``'[0.1'`` (the model then fails on the value,
far from the option), and ``Config.merge_from_dict`` adds any unknown key silently, so a
typo such as ``model.mask_cfg.pp=0.1`` either changes nothing or fails deep inside a
constructor. Here the syntax is checked when the arguments are parsed and the keys against
the loaded config, and both errors name the option and the expected form.
"""
import argparse
import difflib
import glob
import os.path as osp
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.distributed as dist
from mmengine.config import Config, DictAction

from .errors import ConfigOptionError, NotATestConfigError, UserInputError

# Dot-separated names or list indices; a leading '+' adds a key the config does not have.
_KEY = re.compile(r'^\+?[A-Za-z_]\w*(\.\w+)*$')
_FORM = ('each option is KEY=VALUE with no spaces around "=", e.g. model.mask_cfg.p=0.1; '
         'a list is KEY=[a,b] or KEY=a,b, a tuple KEY=(a,b), nested KEY="[(a,b),(c,d)]" '
         '(quote the option for the shell)')


def cfg_option_syntax_error(option: str) -> Optional[str]:
    """What is wrong with the form of one ``KEY=VALUE`` option, or None if nothing.

    Args:
        option (str): One command-line word after ``--cfg-options``.

    Returns:
        str | None: The problem, in words.
    """
    if '=' not in option:
        return f'no "=" in {option!r}: {_FORM}'
    key, value = option.split('=', 1)
    if not _KEY.match(key):
        return (f'{key!r} is not a config key: keys are names joined by dots '
                '(model.mask_cfg.p), list items are numbers (custom_hooks.0.start), and a '
                'leading + adds a key that the config does not set yet')
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
    """mmengine's ``DictAction`` that refuses a malformed ``KEY=VALUE`` by name.

    argparse then prints the usage and the offending option and exits with status 2.
    Keys are checked later, against the config (:func:`check_cfg_options`).
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Optional[Sequence[str]], option_string: Optional[str] = None) -> None:
        """Check each ``KEY=VALUE``, then parse them as mmengine does.

        Args:
            parser (argparse.ArgumentParser): Reports a bad option and exits.
            namespace (argparse.Namespace): Receives the parsed dict.
            values (list[str] | None): The words after the option.
            option_string (str, optional): The option as typed.
        """
        for option in values or []:
            problem = cfg_option_syntax_error(option)
            if problem is not None:
                parser.error(f'{option_string or "--cfg-options"}: {problem}')
        super().__call__(parser, namespace, values, option_string)


def add_cfg_options_argument(parser: argparse.ArgumentParser) -> None:
    """Add our tools' ``--cfg-options`` (checked syntax, checked keys) to ``parser``.

    Args:
        parser (argparse.ArgumentParser): The tool's parser.
    """
    parser.add_argument(
        '--cfg-options', nargs='+', action=CheckedDictAction, metavar='KEY=VALUE',
        help='override settings of the config, e.g. model.mask_cfg.p=0.05. A list is '
        'KEY=[a,b] or KEY=a,b, a tuple KEY=(a,b), nested KEY="[(a,b),(c,d)]" (quotes '
        'needed, no spaces). KEY must exist in the config; +KEY=VALUE adds a key that the '
        'config does not set yet.')


def check_cfg_options(cfg: Config, options: Dict[str, Any]) -> Dict[str, Any]:
    """Check that every key of ``options`` exists in ``cfg``; return them ready to merge.

    A key may go through dicts (by name) and lists (by index). A key written ``+KEY`` may be
    new: its missing part is created by the merge. The ``+`` is removed from the result.

    Args:
        cfg (Config): The loaded config.
        options (dict): ``--cfg-options`` as ``CheckedDictAction`` parsed them.

    Returns:
        dict: The options for ``Config.merge_from_dict``.

    Raises:
        ConfigOptionError: One entry per unknown key, with the valid keys of the nearest
            existing parent and the closest match.
    """
    checked, problems = {}, []
    for raw_key, value in options.items():
        adds = raw_key.startswith('+')
        key = raw_key[1:] if adds else raw_key
        checked[key] = value
        problem = _key_problem(cfg, key, adds)
        if problem is not None:
            problems.append(f'{raw_key}={value!r}: {problem}')
    if problems:
        raise ConfigOptionError('Bad --cfg-options key{}:\n  {}'.format(
            's' if len(problems) > 1 else '', '\n  '.join(problems)))
    return checked


def merge_cfg_options(cfg: Config, options: Optional[Dict[str, Any]]) -> Config:
    """``cfg.merge_from_dict(options)`` after :func:`check_cfg_options`.

    Args:
        cfg (Config): The config, changed in place.
        options (dict | None): Parsed ``--cfg-options``.

    Returns:
        Config: ``cfg``.
    """
    if options:
        cfg.merge_from_dict(check_cfg_options(cfg, options))
    return cfg


def _key_problem(cfg: Config, key: str, adds: bool) -> Optional[str]:
    node: Any = cfg
    parts = key.split('.')
    for depth, part in enumerate(parts):
        parent = '.'.join(parts[:depth]) or 'the config'
        if isinstance(node, (list, tuple)):
            if not part.isdigit() or int(part) >= len(node):
                return (f'{parent} is a list of {len(node)} items: address one by its index, '
                        f'0 to {len(node) - 1} (e.g. {parent}.0.KEY=VALUE)')
            node = node[int(part)]
        elif isinstance(node, (dict, Config)):
            if part in node:
                node = node[part]
                continue
            if adds or part == '_delete_':
                return None
            keys = sorted(str(k) for k in node)
            close = difflib.get_close_matches(part, keys, n=1)
            hint = f' (did you mean {".".join(parts[:depth] + close)!r}?)' if close else ''
            return (f'{parent} has no key {part!r}{hint}. Its keys are: '
                    f'{_listing(keys)}. To add a key that the config does not set yet, '
                    f'write +{key}=VALUE')
        else:
            return (f'{parent} is {node!r} ({type(node).__name__}), not a dict: it has no '
                    f'key {part!r}')
    return None


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

    mmengine fails on a config without a test split with "``self._test_loop`` should not
    be None". A pretraining config has none: its checkpoint is evaluated through the
    backbone, by k-NN, a linear probe or a downstream task, each with its own config under
    ``configs/benchmarks/``. The message lists the ones for the same backbone (judged by
    the names) with the commands, the checkpoint filled in.

    Args:
        cfg (Config): The loaded config.
        config_path (str): Its path, as given.
        checkpoint (str): The checkpoint to evaluate, as given.

    Raises:
        NotATestConfigError: the config has no ``test_dataloader`` or ``test_evaluator``.
    """
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
    """Run a tool's ``main()``, printing a :class:`UserInputError` without a traceback.

    The error goes to stderr as ``TOOL: error: MESSAGE`` (argparse's form) and the process
    exits with status 2. Other exceptions keep their traceback: they are bugs.

    Args:
        main (callable): The tool's entry point, called without arguments.
    """
    try:
        main()
    except UserInputError as error:
        print(f'{osp.basename(sys.argv[0])}: error: {error}', file=sys.stderr)
        raise SystemExit(2) from None
    close_process_group()


def close_process_group() -> None:
    """Let every rank finish, then close the process group before the interpreter exits.

    A gloo group left to the interpreter's teardown can abort the process ("terminate called
    without an active exception") while another rank is still using it, failing a run whose
    work is done. Only called after a successful ``main()``: a barrier after one rank's
    error would hang the others.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
