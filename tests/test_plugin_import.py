"""Installing and importing the plugin.

- ``pip install -e .`` asks for no torch and no OpenMMLab distribution, so that any provider of
  each import serves; ``import mst_mm`` checks their versions instead and names the fix.
- ``import mst_mm``, and then one checkpoint load by each of our load paths, change nothing of
  other libraries: torch's weights-only allow-list, mmengine's checkpoint loaders, and every
  registry entry of mmengine, mmpretrain, mmdet and mmseg. Checked in a fresh process that
  first registers every module of mmpretrain, mmdet and mmseg.
"""
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from mst_mm.dependencies import REQUIRED, requirement_problem, version_tuple
from tests.helpers import REPO

# Distributions that provide torch or an OpenMMLab import: none may be an install requirement.
PROVIDERS = {'torch', 'torchvision', 'mmcv', 'mmcv-lite', 'mmcv-full', 'onedl-mmcv', 'mmengine',
             'onedl-mmengine', 'mmpretrain', 'onedl-mmpretrain', 'mmdet', 'onedl-mmdetection',
             'mmsegmentation', 'onedl-mmsegmentation'}


def import_mst_mm(prelude: str = '', pythonpath: str = '') -> subprocess.CompletedProcess:
    """``import mst_mm`` in a fresh interpreter, after ``prelude``, with ``pythonpath`` first."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pythonpath, str(REPO)])))
    return subprocess.run([sys.executable, '-c', prelude + '\nimport mst_mm'], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def fake_package(root: Path, name: str, source: str) -> str:
    (root / name).mkdir(parents=True)
    (root / name / '__init__.py').write_text(source)
    return str(root)


BLOCK_MMCV = '''
import sys

class NoMMCV:  # as if no distribution provided the mmcv package
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'mmcv':
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)

sys.meta_path.insert(0, NoMMCV())
'''


def test_import_without_mmcv_names_every_provider_and_its_install_command():
    result = import_mst_mm(BLOCK_MMCV)
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()
    assert error[-2] == ('ImportError: mst_mm needs mmcv>=2.0.0,<2.4.0, but mmcv is not '
                         'installed. Fix: install one provider of the mmcv package: the prebuilt '
                         'mmcv for your torch (pip install -U openmim && mim install '
                         '"mmcv>=2.0.0,<2.2.0"), mmcv-lite for pretraining alone (pip install '
                         '"mmcv-lite>=2.0.0,<2.4.0") or OneDL\'s (pip install onedl-mmcv).')
    assert error[-1] == 'See docs/install.md for each environment.'


def test_import_with_an_unfit_mmcv_names_its_version_and_the_range(tmp_path):
    result = import_mst_mm(pythonpath=fake_package(tmp_path, 'mmcv', "__version__ = '1.7.2'\n"))
    assert result.returncode == 1
    assert ('ImportError: mst_mm needs mmcv>=2.0.0,<2.4.0, but mmcv 1.7.2 is installed'
            in result.stderr), result.stderr[-2000:]
    assert 'mim install "mmcv>=2.0.0,<2.2.0"' in result.stderr
    # mmpretrain imports mmcv, so it is not imported to be checked: only mmcv is named.
    assert 'mst_mm needs mmpretrain' not in result.stderr


def test_a_provider_whose_own_import_fails_shows_that_failure(tmp_path):
    broken = fake_package(tmp_path, 'mmcv', 'import a_module_mmcv_needs_but_lacks\n')
    result = import_mst_mm(pythonpath=broken)
    assert result.returncode == 1
    assert ("ModuleNotFoundError: No module named 'a_module_mmcv_needs_but_lacks'"
            in result.stderr), result.stderr[-2000:]
    assert 'mst_mm needs' not in result.stderr


@pytest.mark.parametrize('name, version', [
    ('torch', '2.1.2+cu121'), ('torch', '2.13.0'), ('torch', '2.10.0+cu128'),
    ('mmcv', '2.1.0'), ('mmcv', '2.2.0'), ('mmcv', '2.3.6'),          # official, OneDL
    ('mmengine', '0.10.7'), ('mmengine', '0.10.12'),
    ('mmpretrain', '1.2.0'), ('mmpretrain', '1.3.6'),
])
def test_the_tested_official_and_onedl_versions_are_accepted(name, version):
    assert requirement_problem(name, version) is None


@pytest.mark.parametrize('name, version, installed', [
    ('torch', '2.0.1', 'torch 2.0.1 is installed'),
    ('mmcv', '1.7.2', 'mmcv 1.7.2 is installed'),
    ('mmcv', '2.4.0', 'mmcv 2.4.0 is installed'),
    ('mmengine', '1.0.0', 'mmengine 1.0.0 is installed'),
    ('mmpretrain', '1.1.1', 'mmpretrain 1.1.1 is installed'),
    ('mmpretrain', 'unknown', 'mmpretrain unknown is installed'),
    ('mmengine', None, 'mmengine is not installed'),
])
def test_versions_outside_the_range_are_refused_with_the_fix(name, version, installed):
    problem = requirement_problem(name, version)
    low, high = REQUIRED[name]
    assert problem.startswith(f'mst_mm needs {name}>={low}')
    assert installed in problem and 'pip install' in problem
    assert (f',<{high}' in problem) == (high is not None)


def test_versions_compare_as_numbers():
    assert version_tuple('2.10.0+cu128') > version_tuple('2.9.1') > version_tuple('2.1')
    assert version_tuple('2.0.0rc4') == (2, 0, 0) and version_tuple('x') == (0, 0, 0)


def requirement_lines(path: Path) -> list:
    lines = (line.split('#')[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def test_mminstall_states_the_ranges_that_the_import_checks():
    stated = {re.match(r'[\w-]+', line).group(): line
              for line in requirement_lines(REPO / 'requirements' / 'mminstall.txt')}
    checked = {name: f'{name}>={low},<{high}' for name, (low, high) in REQUIRED.items()
               if name != 'torch'}
    assert stated == checked


@pytest.fixture(scope='module')
def package_metadata(tmp_path_factory) -> dict:
    """mst_mm's requirements as setuptools writes them into an install's metadata."""
    out = tmp_path_factory.mktemp('egg_info')
    result = subprocess.run([sys.executable, 'setup.py', '-q', 'egg_info', '--egg-base', str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    info = out / 'mst_mm.egg-info'
    sections, current = {'': []}, ''
    for line in (info / 'requires.txt').read_text().splitlines():
        if line.startswith('['):
            current = line.strip('[]')
            sections[current] = []
        elif line.strip():
            sections[current].append(line.strip())
    python = re.search(r'^Requires-Python: (.*)$', (info / 'PKG-INFO').read_text(), re.M)
    return dict(requires=sections, python=python.group(1))


def test_install_requires_names_no_torch_and_no_openmmlab_distribution(package_metadata):
    names = {re.match(r'[\w.-]+', line).group().lower()
             for line in package_metadata['requires']['']}
    assert names and not names & PROVIDERS, names
    as_written = {str(Requirement(line)) for line in package_metadata['requires']['mim']}
    stated = {str(Requirement(line))
              for line in requirement_lines(REPO / 'requirements' / 'mminstall.txt')}
    assert as_written == stated


def test_python_requires_is_what_ci_tests(package_metadata):
    # .ci/run's stacks: Python 3.10 (torch 2.1), 3.11 (.venv) and 3.12 (OneDL).
    assert SpecifierSet(package_metadata['python']) == SpecifierSet('>=3.10,<3.13')
    ci = (REPO / '.ci' / 'run').read_text()
    stacks = [REPO / path for path in re.findall(r'--stack (\S+)', ci)]
    named = {re.search(r'^# python: (3\.\d+)$', stack.read_text(), re.M).group(1)
             for stack in stacks}
    assert named | {'3.11'} == {'3.10', '3.11', '3.12'}


@pytest.mark.network
@pytest.mark.slow
def test_pip_resolves_the_editable_install_in_a_fresh_venv_without_any_provider(tmp_path):
    env_dir = tmp_path / 'venv'
    venv.EnvBuilder(with_pip=True).create(env_dir)
    report = tmp_path / 'report.json'
    result = subprocess.run(
        [env_dir / 'bin' / 'python', '-m', 'pip', 'install', '--dry-run', '--quiet',
         '--report', report, '-e', REPO], capture_output=True, text=True, timeout=600)
    if result.returncode != 0 and 'No matching distribution found' in result.stderr:
        pytest.skip('the package index is not reachable: ' + result.stderr.strip()[-300:])
    assert result.returncode == 0, result.stderr[-3000:]
    installs = json.loads(report.read_text())['install']
    collected = {item['metadata']['name'].lower() for item in installs}
    assert 'mst-mm' in collected or 'mst_mm' in collected
    assert not collected & PROVIDERS, sorted(collected)

SCRIPT = r'''
import json, os, sys, tempfile
import numpy as np
import torch
import mmengine.registry as root
from mmengine.registry import Registry
from mmengine.runner import CheckpointLoader
from mmpretrain.utils import register_all_modules as pretrain_all
from mmdet.utils import register_all_modules as det_all
from mmseg.utils import register_all_modules as seg_all
pretrain_all(False); det_all(False); seg_all(False)


def registries():
    todo, seen = [r for r in vars(root).values() if isinstance(r, Registry)], {}
    while todo:
        registry = todo.pop()
        if id(registry) not in seen:
            seen[id(registry)] = registry
            todo.extend(registry.children.values())
    return seen.values()


def snapshot():
    return dict(
        entries={f'{r.scope}/{r.name}/{key}': id(obj)
                 for r in registries() for key, obj in r._module_dict.items()},
        schemes={prefix: id(loader) for prefix, loader in CheckpointLoader._schemes.items()},
        safe_globals=sorted(map(str, torch.serialization.get_safe_globals())))


snapshots = [snapshot()]
import mst_mm  # noqa: F401
snapshots.append(snapshot())

from mmengine.logging import MessageHub
from mmpretrain.models import VisionTransformer
from mst_mm.engine import CheckedPretrainedInit, CheckedRunner, read_checkpoint

# An mmengine training checkpoint: numpy values and a message hub of HistoryBuffers.
work = tempfile.mkdtemp()
vit = dict(arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64),
           img_size=32, patch_size=8)
weights = VisionTransformer(**vit).state_dict()
hub = MessageHub.get_instance('plugin_import')
hub.update_scalar('train/loss', np.float64(1.0))
checkpoint = os.path.join(work, 'epoch_1.pth')
torch.save(dict(meta=dict(epoch=1, iter=2, seed=np.int64(0)), message_hub=hub.state_dict(),
                state_dict={**{'backbone.' + k: v for k, v in weights.items()},
                            **{'teacher.module.0.' + k: v for k, v in weights.items()}}),
           checkpoint)
assert read_checkpoint(checkpoint)['message_hub']['log_scalars']['train/loss'].mean() == 1.0
CheckedPretrainedInit(checkpoint, prefix='teacher.module.0.')(VisionTransformer(**vit))
runner = CheckedRunner(
    model=dict(type='FeatureEmbedder',
               backbone=dict(type='VisionTransformer', out_type='cls_token', **vit)),
    work_dir=os.path.join(work, 'run'), default_scope='mmpretrain')
runner.load_checkpoint(checkpoint)
sys.path.insert(0, 'tools/model_converters')
import mst2downstream
mst2downstream.main([checkpoint, os.path.join(work, 'backbone.pth'), '--target', 'mmpretrain'])
snapshots.append(snapshot())
print('\n' + json.dumps(snapshots))
'''


@pytest.mark.slow
def test_import_and_our_loads_change_nothing_of_other_libraries():
    result = subprocess.run([sys.executable, '-c', SCRIPT], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    before, imported, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(before['entries']) > 1000  # mmpretrain, mmdet and mmseg were all loaded
    for after in (imported, loaded):
        changed = {key for key, obj in before['entries'].items()
                   if after['entries'].get(key) != obj}
        assert not changed, sorted(changed)[:10]
        assert after['schemes'] == before['schemes']             # mmengine's loaders
        assert after['safe_globals'] == before['safe_globals']   # torch's allow-list
    added = set(imported['entries']) - set(before['entries'])
    assert {'mmpretrain/model/MST', 'mmengine/weight initializer/CheckedPretrained'} <= added
    # No name of ours is also a name of the same registry in another library.
    names = {tuple(key.split('/', 2)[1:]) for key in before['entries']}
    clashes = [key for key in added if tuple(key.split('/', 2)[1:]) in names]
    assert not clashes, clashes


@pytest.mark.network
@pytest.mark.slow
def test_the_pretraining_block_of_the_install_guide_runs_around_the_users_torch(tmp_path):
    """docs/install.md's mmcv-lite block, command for command, in a fresh venv whose torch is
    this interpreter's (seen through a .pth file, as a user's CUDA torch would be)."""
    from tests.test_repository.test_wheelhouse import user_torch_site

    env_dir = tmp_path / 'venv'
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / 'bin' / 'python'
    purelib = subprocess.run(
        [python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
        capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / 'user_torch.pth').write_text(f'{user_torch_site(tmp_path / "torch")}\n')
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    for command in (['-m', 'pip', 'install', '--quiet', 'mmcv-lite==2.1.0', 'mmengine==0.10.7',
                     'mmpretrain==1.2.0', 'setuptools<82'],
                    ['-m', 'pip', 'install', '--quiet', '-e', REPO],
                    [REPO / 'tools' / 'stack_check.py']):
        result = subprocess.run([python, *command], capture_output=True, text=True, env=env,
                                cwd=tmp_path, timeout=900)
        if result.returncode != 0 and 'No matching distribution found' in result.stderr:
            pytest.skip('the package index is not reachable: ' + result.stderr.strip()[-300:])
        assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-3000:])
    assert '[stack_check] mmcv: mmcv 2.1.0 (lite, mmcv-lite)' in result.stdout
    assert 'student updated' in result.stdout
    torch_file = subprocess.run([python, '-c', 'import torch; print(torch.__file__)'], env=env,
                                capture_output=True, text=True, check=True).stdout.strip()
    assert torch_file.startswith(str(tmp_path / 'torch')), torch_file
