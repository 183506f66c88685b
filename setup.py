"""mst_mm: Masked Self-Supervised Transformer (MST) as an OpenMMLab plugin."""
import os
import os.path as osp
import shutil
import sys
from typing import List, Optional

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))

# What `mim` reads from an installed package: the configs (`mim train mst_mm NAME.py` finds a
# config by its file name), the user tools it runs (mmpretrain's layout; the research kit's
# tools live in projects/mst_research/tools) and the model index that `mim search` lists (it
# imports configs/mst/metafile.yml).
USER_TOOLS = ('train.py', 'test.py', 'dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
              'slurm_test.sh', 'analysis/browse_dataset.py', 'analysis/knn_eval.py',
              'analysis/visualize_mst.py', 'model_converters')
MIM_FILES = ('configs', 'model-index.yml') + tuple(f'tools/{name}' for name in USER_TOOLS)
MIM_ROOT = osp.join(ROOT, 'mst_mm', '.mim')


def mim_mode() -> str:
    """'copy' when building a wheel or sdist (or with MST_MM_MIM_COPY set), else 'symlink'.

    As in mmpretrain's setup.py: a built package must hold real files, while an editable
    install links to the repository so that edited configs take effect at once.
    """
    building = {'bdist_wheel', 'sdist'} & set(sys.argv)
    return 'copy' if building or os.environ.get('MST_MM_MIM_COPY') else 'symlink'


def _remove(path: str) -> None:
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


def add_mim_extension(mim_root: str = MIM_ROOT, mode: Optional[str] = None) -> None:
    """Expose configs/, the user tools and model-index.yml under mst_mm/.mim for `mim`.

    Args:
        mim_root: the folder to fill, `mst_mm/.mim` of this repository by default.
        mode: 'symlink' or 'copy'; by default :func:`mim_mode` decides.
    """
    mode = mode or mim_mode()
    if mode not in ('symlink', 'copy'):
        raise ValueError(f"mode must be 'symlink' or 'copy', not {mode!r}")
    for top in {name.split('/')[0] for name in MIM_FILES}:
        _remove(osp.join(mim_root, top))
    for name in MIM_FILES:
        src, dst = osp.join(ROOT, name), osp.join(mim_root, name)
        os.makedirs(osp.dirname(dst), exist_ok=True)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, osp.dirname(dst)), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copyfile(src, dst)


def read_text(name: str) -> str:
    with open(osp.join(ROOT, name)) as f:
        return f.read()


def read_requirements(name: str) -> List[str]:
    """The requirement lines of a requirements file, without comments."""
    lines = (line.split('#')[0].strip() for line in read_text(name).splitlines())
    return [line for line in lines if line]


def read_version() -> str:
    scope: dict = {}
    with open(osp.join(ROOT, 'mst_mm', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


if __name__ == '__main__':
    add_mim_extension()
    setup(
        name='mst_mm',
        version=read_version(),
        description='MST (Masked Self-Supervised Transformer) for OpenMMLab',
        long_description=read_text('README.md'),
        long_description_content_type='text/markdown',
        license='Apache License 2.0',
        packages=find_packages(exclude=('configs', 'tools', 'tests')),
        include_package_data=True,
        package_data={'mst_mm': ['.mim/configs/**/*', '.mim/tools/**/*', '.mim/model-index.yml']},
        # What CI tests (docs/install.md, "Tested stacks"): Python 3.10, 3.11 and 3.12.
        python_requires='>=3.10,<3.13',
        # As OpenMMLab's own projects: torch, mmcv, mmengine and mmpretrain are not
        # install_requires, so that pip keeps the user's CUDA torch and whichever provider of
        # each import is installed (mmcv, mmcv-lite, OneDL's onedl-mmcv, ...), and never
        # builds mmcv's sdist. `import mst_mm` checks their versions (mst_mm/dependencies.py);
        # `mim install -e .` installs them from extras_require['mim'].
        # numpy 2: all but mmpretrain's ColorJitter (docs/install.md, "numpy 2").
        install_requires=['numpy>=1.26,<3', 'Pillow'],
        extras_require={
            'mim': read_requirements('requirements/mminstall.txt'),
            'downstream': ['mmdet>=3.3.0,<3.4.0', 'mmsegmentation>=1.2.2,<1.3.0', 'ftfy', 'regex'],
            'tests': read_requirements('requirements/tests.txt'),
        },
        zip_safe=False,
    )
