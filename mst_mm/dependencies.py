"""The versions of torch and OpenMMLab that mst_mm runs with, checked when it is imported.

As mmdet's ``__init__`` does, but each version is read from the imported module's
``__version__``, so any distribution that provides the import serves: ``mmcv``, ``mmcv-lite``
or ``onedl-mmcv``; ``mmengine`` or ``onedl-mmengine``; ``mmpretrain`` or ``onedl-mmpretrain``.
``requirements/mminstall.txt`` states the same ranges for pip (``pip install -e ".[mim]"``).
"""
import importlib
import importlib.metadata as metadata
import importlib.util
import re
from typing import Dict, Optional, Tuple

#: import name -> (lowest version, first version refused; None: no upper bound yet).
REQUIRED: Dict[str, Tuple[str, Optional[str]]] = {
    'torch': ('2.1.0', None),
    'mmcv': ('2.0.0', '2.4.0'),
    'mmengine': ('0.10.0', '1.0.0'),
    'mmpretrain': ('1.2.0', '1.4.0'),
}

#: How to install each, for the error message; docs/install.md has one block per environment.
FIXES: Dict[str, str] = {
    'torch': 'pip install torch torchvision  (the CUDA build for your driver: '
             'https://pytorch.org/get-started/locally/)',
    'mmcv': 'install one provider of the mmcv package: the prebuilt mmcv for your torch '
            '(pip install -U openmim && mim install "mmcv>=2.0.0,<2.2.0"), mmcv-lite for '
            'pretraining alone (pip install "mmcv-lite>=2.0.0,<2.4.0") or OneDL\'s '
            '(pip install onedl-mmcv)',
    'mmengine': 'pip install "mmengine>=0.10.0,<1.0.0"  '
                '(or OneDL\'s: pip install onedl-mmengine)',
    'mmpretrain': 'pip install "mmpretrain>=1.2.0,<1.4.0"  '
                  '(or OneDL\'s: pip install onedl-mmpretrain)',
}


def version_tuple(version: str) -> Tuple[int, ...]:
    """``'2.1.2+cu121'`` -> ``(2, 1, 2)``; a pre-release counts as its release, and a version
    that cannot be read as 0.0.0 (refused)."""
    match = re.match(r'(\d+)\.(\d+)(?:\.(\d+))?', version)
    return tuple(int(part or 0) for part in match.groups()) if match else (0, 0, 0)


def requirement_problem(name: str, version: Optional[str]) -> Optional[str]:
    """What is wrong with ``name`` at ``version`` (None: not importable), or None if it fits.

    The message names what is installed, what is needed and the command that fixes it.
    """
    low, high = REQUIRED[name]
    needed = f'{name}>={low}' + (f',<{high}' if high else '')
    if version is None:
        found = f'{name} is not installed'
    elif version_tuple(version) < version_tuple(low) or (
            high is not None and version_tuple(version) >= version_tuple(high)):
        providers = metadata.packages_distributions().get(name, [])
        found = f'{name} {version} is installed' + (
            f' (distribution {", ".join(sorted(set(providers)))})' if providers else '')
    else:
        return None
    return f'mst_mm needs {needed}, but {found}. Fix: {FIXES[name]}.'


def check_dependencies() -> None:
    """Raise ImportError naming every missing or unfit package of :data:`REQUIRED`."""
    problems = []
    for name in REQUIRED:
        if problems and importlib.util.find_spec(name) is not None:
            continue  # it imports those named above (mmpretrain imports mmcv): they come first
        try:
            version = getattr(importlib.import_module(name), '__version__', 'unknown')
        except ModuleNotFoundError as error:
            if error.name != name:
                raise  # the package is there but one of its own imports fails: show that
            version = None
        problem = requirement_problem(name, version)
        if problem:
            problems.append(problem)
    if problems:
        raise ImportError('\n'.join(problems + ['See docs/install.md for each environment.']))
