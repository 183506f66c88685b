"""MST for OpenMMLab.

Importing this package registers its modules into mmpretrain's registries, so configs use
``default_scope='mmpretrain'`` with ``custom_imports=dict(imports=['mst_mm'])``.
"""
from .dependencies import check_dependencies
from .version import __version__

# Before anything imports mmcv, mmengine or mmpretrain: a missing or unfit one is named with
# its fix instead of failing somewhere inside them.
check_dependencies()

from . import datasets, engine, evaluation, models  # noqa: E402, F401  (registration)

__all__ = ['__version__']
