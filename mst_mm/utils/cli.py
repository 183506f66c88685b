"""Our tools' command line: ``--cfg-options`` checked, with mmengine's semantics; clean errors."""
import argparse
import difflib
import functools
import gc
import glob
import os.path as osp
import re
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch.distributed as dist
from mmengine.config import Config, DictAction
from mmpretrain.registry import MODELS

from mst_mm.engine.safe_loading import read_checkpoint
from mst_mm.errors import UserInputError

_KEY = re.compile(r'^[A-Za-z_]\w*(\.\w+)*$')  # names joined by dots, list items by index
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
    brackets = re.sub(r'[^()[\]]', '', value)
    while '()' in brackets or '[]' in brackets:  # a balanced nesting reduces to nothing
        brackets = brackets.replace('()', '').replace('[]', '')
    if brackets:
        return f'unbalanced brackets in the value of {key}: {value!r}; {_FORM}'
    quote = next((q for q in '\'"' if value.count(q) % 2), None)
    return quote and f'unmatched {quote} in the value of {key}: {value!r}; {_FORM}'


class CheckedDictAction(DictAction):
    """mmengine's ``DictAction``, refusing a malformed ``KEY=VALUE`` by name (status 2)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for problem in filter(None, map(cfg_option_syntax_error, values or [])):
            parser.error(f'{option_string or "--cfg-options"}: {problem}')
        super().__call__(parser, namespace, values, option_string)


def add_cfg_options_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--cfg-options', nargs='+', action=CheckedDictAction, metavar='KEY=VALUE',
                        help=f'override settings of the config: {_FORM}. As in mmengine, a KEY '
                        'the config does not set is added (a warning names the closest key).')


def check_cfg_options(cfg: Config, options: Dict[str, Any]) -> List[str]:
    """A line per key that ``cfg`` does not set; a UserInputError for one that cannot merge."""
    added, problems = [], []
    for key, value in options.items():
        node, parts = cfg, key.split('.')
        for depth, part in enumerate(parts):
            where = f"{key}={value!r}: {'.'.join(parts[:depth]) or 'the config'}"
            if isinstance(node, (list, tuple)):
                if not part.isdigit() or int(part) >= len(node):
                    problems.append(f'{where} is a list of {len(node)} items: address one by its '
                                    f'index, 0 to {len(node) - 1}')
                    break
                node = node[int(part)]
            elif not isinstance(node, (dict, Config)):
                problems.append(f'{where} is {node!r} ({type(node).__name__}), not a dict: it has '
                                f'no key {part!r}')
                break
            elif part in node:
                node = node[part]
            else:
                keys = sorted(map(str, node))
                close = difflib.get_close_matches(part, keys, n=1)
                hint = f' (did you mean {".".join(parts[:depth] + close)!r}?)' if close else ''
                if part != '_delete_':  # mmengine's flag (replace, do not merge), not a key
                    added.append(f'{where} has no key {part!r}{hint}. Its keys are: '
                                 f'{", ".join(keys)}.')
                break
    if problems:
        raise UserInputError('Bad --cfg-options key(s):\n  ' + '\n  '.join(problems))
    return added


def merge_cfg_options(cfg: Config, options: Optional[Dict[str, Any]]) -> Config:
    """``cfg.merge_from_dict(options)`` in place, warning for each key the config did not set."""
    if options:
        if added := check_cfg_options(cfg, options):
            warnings.warn('--cfg-options adds keys that the config does not set (check for a '
                          'typo):\n  ' + '\n  '.join(added), stacklevel=2)
        cfg.merge_from_dict(options)
    return cfg


_PACKAGE = osp.dirname(osp.dirname(osp.abspath(__file__)))  # mst_mm/


def config_root(package: Optional[str] = None) -> Tuple[str, bool]:
    """The folder that holds ``configs/``, and whether it is a source checkout: the repository
    around ``package`` (by default this mst_mm) where there is one, else the configs that the
    wheel carries for ``mim`` (``mst_mm/.mim/configs``)."""
    package = package or _PACKAGE
    checkout = osp.dirname(package)
    if osp.isdir(osp.join(checkout, 'configs', 'benchmarks')):
        return checkout, True
    return osp.join(package, '.mim'), False


_CONVERT = ('python tools/model_converters/mst2downstream.py {checkpoint} {pretrained} '
            '--target %s, then python tools/train.py {config}')
_EVALUATIONS = (  # what evaluates a pretrained checkpoint: (title, configs/benchmarks/X, command)
    ('k-NN (no training)', 'knn', 'python tools/analysis/knn_eval.py {config} {checkpoint}'),
    ('linear probe', 'classification', 'python tools/train.py {config} --cfg-options '
     'model.backbone.init_cfg.checkpoint={checkpoint}'),
    ('detection (mmdet)', 'mmdetection', _CONVERT % 'mmdet'),
    ('segmentation (mmseg)', 'mmsegmentation', _CONVERT % 'mmseg'))


def check_test_config(cfg: Config, config_path: str, checkpoint: str) -> None:
    """Refuse a config that ``tools/test.py`` cannot run (k-NN, pretraining): say what to run."""
    if (cfg.get('test_cfg') or {}).get('type') == 'KNNTestLoop':
        raise UserInputError(
            f'{config_path} is a k-NN config: run it with the k-NN tool, python tools/analysis/'
            f'knn_eval.py {config_path} {checkpoint} (it prints the table and takes --weights, '
            '--ks and --out; torchrun ... --launcher pytorch for several processes).')
    missing = [key for key in ('test_dataloader', 'test_evaluator') if cfg.get(key) is None]
    if not missing:
        return
    if (cfg.get('model') or {}).get('type') != 'MST':
        raise UserInputError(f'{config_path} has no {" or ".join(missing)}: tools/test.py '
                             'evaluates configs with a test split and a metric, such as the '
                             'k-NN and linear-probe configs under configs/benchmarks/.')
    token = re.search('deit-s|swin-nano|swin-t|vit-tiny|vit-b|vit-s', osp.basename(config_path))
    root, in_checkout = config_root()

    def shown(config: str) -> str:  # relative in a checkout, where the tools are run
        return osp.relpath(config, root) if in_checkout else config

    configs = [(title, command, config) for title, folder, command in _EVALUATIONS
               for config in sorted(glob.glob(f'{root}/configs/benchmarks/{folder}/*.py'))]
    # The benchmark configs of the same backbone, if the names tell; otherwise all of them.
    same = [entry for entry in configs if token and token[0] in osp.basename(entry[2])]
    # Of those, the ones whose backbone is as wide as the checkpoint's (the 96-wide demo ViT
    # and the 48-wide evidence ViT share a name): a config that names no width is kept.
    width = _checkpoint_width(checkpoint) or _backbone_width((cfg.get('model') or {}).get(
        'backbone') or {})
    candidates = same or configs
    fits = [entry for entry in candidates
            if width is None or _config_width(entry[2]) in (None, width)]
    lines = [f'  {title}: ' + command.format(config=shown(config),
                                             checkpoint=checkpoint, pretrained=_pretrained(config))
             for title, command, config in fits]
    if not fits:
        lines = [f'  none of the benchmark configs{" of this backbone" if same else ""} is '
                 f'{width} wide; copy one and set its embed_dims to {width}: ' + ', '.join(
                     shown(config) for _, _, config in candidates)]
    raise UserInputError(
        f'{config_path} is a pretraining config (model type MST): it has no test split or '
        'metric, so tools/test.py has nothing to evaluate. Evaluate the pretrained backbone '
        f'of {checkpoint} instead (the configs hold the data paths and settings):\n'
        + '\n'.join(lines) + f'\nTo continue pretraining from it: python tools/train.py '
        f'{config_path} --resume {checkpoint}')


def _backbone_width(backbone: dict) -> Optional[int]:
    """``embed_dims`` of a backbone config (an argument, an ``arch`` dict, or a name in the
    backbone's ``arch_zoo``)."""
    arch = backbone.get('arch')
    if isinstance(arch, dict) or 'embed_dims' in backbone:
        return (arch if isinstance(arch, dict) else backbone).get('embed_dims')
    try:
        return MODELS.get(backbone['type']).arch_zoo[arch]['embed_dims']
    except Exception:  # an unknown type or arch: the width is not known
        return None


def _checkpoint_width(checkpoint: str) -> Optional[int]:
    """The patch embedding's output channels in an MST checkpoint, or None if unreadable."""
    if not osp.isfile(checkpoint):
        return None
    try:
        state = read_checkpoint(checkpoint, map_location='cpu', mmap=True)
        state = state.get('state_dict', state)
        return int(state['backbone.patch_embed.projection.weight'].shape[0])
    except Exception:  # not an MST checkpoint (test.py's own load names the problem)
        return None


@functools.lru_cache(maxsize=None)
def _config_width(config: str) -> Optional[int]:
    """The backbone width of a benchmark config, or None if it cannot be read."""
    try:
        return _backbone_width(Config.fromfile(config).model.backbone)
    except Exception:  # e.g. an mmdet / mmseg config without mmdet / mmseg installed
        with open(config) as f:
            found = re.search(r'^embed_dims = (\d+)', f.read(), re.MULTILINE)
        return int(found[1]) if found else None


def _pretrained(config: str) -> str:  # the converted backbone a downstream config reads
    with open(config) as f:
        found = re.search(r"^pretrained = '([^']+)'", f.read(), re.MULTILINE)
    return found[1] if found else 'BACKBONE.pth'


def run_tool(main: Callable[[], Any]) -> None:
    """Run ``main()``; a UserInputError becomes ``TOOL: error: MESSAGE``, status 2 (argparse's)."""
    try:
        with warnings.catch_warnings():
            # torch 2.1's own weights-only loader warns on every load that it touches the
            # TypedStorage API: noise on a tool's stderr, where its one error line goes.
            warnings.filterwarnings('ignore', 'TypedStorage is deprecated', UserWarning)
            main()
    except UserInputError as error:
        print(f'{osp.basename(sys.argv[0])}: error: {error}', file=sys.stderr)
        raise SystemExit(2) from None
    if dist.is_available() and dist.is_initialized():
        # Left to teardown, gloo can abort a finished run; after an error a barrier would hang.
        # The runner sits in reference cycles, and its DDP reducer holds the group: free them
        # while the interpreter is alive, not in its teardown (a rare SIGABRT under srun).
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
