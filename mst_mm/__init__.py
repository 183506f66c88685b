"""MST for OpenMMLab.

Importing this package registers its modules into mmpretrain's registries, so configs use
``default_scope='mmpretrain'`` with ``custom_imports=dict(imports=['mst_mm'])``.
"""
from . import datasets, engine, evaluation, models  # noqa: F401  (registration)
from .version import __version__

__all__ = ['__version__']
