"""mst_mm: Masked Self-Supervised Transformer (MST) as an OpenMMLab plugin."""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))


# What `mim` reads from an installed package: the configs (found by name), the tools it runs,
# and the model index that `mim search` lists (it imports configs/mst/metafile.yml).
MIM_FILES = ('configs', 'tools', 'model-index.yml')


def add_mim_extension() -> None:
    """Expose configs/, tools/ and model-index.yml under mst_mm/.mim so that `mim` finds them.

    Editable installs get symlinks; regular builds get copies, as in
    mmpretrain's own setup.py.
    """
    mode = 'symlink' if os.environ.get('MST_MM_MIM_COPY') is None else 'copy'
    mim_root = osp.join(ROOT, 'mst_mm', '.mim')
    os.makedirs(mim_root, exist_ok=True)
    for name in MIM_FILES:
        src, dst = osp.join(ROOT, name), osp.join(mim_root, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim_root), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copyfile(src, dst)


def read_text(name: str) -> str:
    with open(osp.join(ROOT, name)) as f:
        return f.read()


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
        python_requires='>=3.8',
        # Loose on purpose: users bring their own CUDA torch and mmcv build.
        # The exact, verified pins live in requirements/*.txt.
        install_requires=[
            'torch>=2.0',
            'mmcv>=2.0.0,<2.2.0',
            'mmengine>=0.10.0,<1.0.0',
            'mmpretrain>=1.2.0,<1.3.0',
            'numpy<2',
        ],
        extras_require={
            'downstream': ['mmdet>=3.3.0,<3.4.0', 'mmsegmentation>=1.2.2,<1.3.0', 'ftfy', 'regex'],
            'tests': ['pytest', 'ruff'],
        },
        zip_safe=False,
    )
