"""Offline install: tools/collect_wheelhouse.sh, then tools/setup_env.sh --wheelhouse with the
index switched off, into a fresh virtual environment whose torch is the user's own.

The user's torch is this interpreter's torch and torchvision (with their dependencies) seen
through a .pth file, as a CUDA torch installed before our stack would be; so the wheelhouse
stays small (no 5 GB torch) and the shared .venv is never modified. Collecting the
wheelhouse needs the package index: the test skips, saying so, when it cannot be reached,
unless MST_MM_WHEELHOUSE names a wheelhouse collected before (with --no-torch). Those tests
are marked ``network`` and ``slow``; the argument checks run offline in seconds.
"""
import importlib.metadata as metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STACK_CHECK = REPO / 'tools' / 'stack_check.py'

SETUP = REPO / 'tools' / 'setup_env.sh'
COLLECT = REPO / 'tools' / 'collect_wheelhouse.sh'
# Provided by the wheelhouse, so that the install of our stack is what puts them there.
NOT_FROM_USER_TORCH = {'numpy', 'pillow', 'setuptools'}


def run(cmd, timeout=900, **env_overrides) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS='1', **env_overrides)
    env.pop('PYTHONPATH', None)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd='/')


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-4000:] + result.stderr[-4000:]


def user_torch_site(dest: Path) -> Path:
    """Symlinks to torch, torchvision and what they need, from this interpreter's
    site-packages: a pre-installed torch that no pip run of ours may touch."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    dest.mkdir()
    todo, seen = [('torch', ()), ('torchvision', ())], set()
    while todo:
        name, extras = todo.pop()
        name = canonicalize_name(name)
        if (name, extras) in seen or name in NOT_FROM_USER_TORCH:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add((name, extras))
        # What pip checks when a requirement asks for torch: its dependencies, and those of
        # the extras that it asks for in turn (torch wants cuda-toolkit[cudart, ...]).
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or any(
                    requirement.marker.evaluate({'extra': extra}) for extra in ('', *extras)):
                todo.append((requirement.name, tuple(sorted(requirement.extras))))
        for top in {Path(f).parts[0] for f in dist.files or []} - {'..', '__pycache__'}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (dest / top).exists():
                (dest / top).symlink_to(source)
    assert {'torch', 'torchvision'} <= {name for name, _ in seen}
    return dest


@pytest.fixture(scope='module')
def wheelhouse(tmp_path_factory) -> Path:
    given = os.environ.get('MST_MM_WHEELHOUSE')
    if given:
        return Path(given)
    tmp = tmp_path_factory.mktemp('wheelhouse')
    probe = run([sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check',
                 '--no-deps', '--only-binary=:all:', 'mmcv-lite==2.1.0', '-d', tmp / 'probe'],
                timeout=120)
    if probe.returncode != 0:
        pytest.skip('collecting a wheelhouse needs the package index, which is not reachable '
                    '(or set MST_MM_WHEELHOUSE to a wheelhouse collected with --no-torch): '
                    + probe.stderr.strip().splitlines()[-1])
    collected = run(['bash', COLLECT, '--dest', tmp / 'wh', '--no-torch', '--mmcv', 'lite'],
                    PYTHON=sys.executable)
    assert collected.returncode == 0, output(collected)
    return tmp / 'wh'


@pytest.fixture(scope='module')
def offline_venv(wheelhouse, tmp_path_factory):
    """A new venv with the user's torch on its path, our stack installed from the wheelhouse
    alone, and an empty mmcv wheel cache (so nothing could have been built)."""
    tmp = tmp_path_factory.mktemp('offline')
    venv = tmp / 'venv'
    base_python = Path(sys.base_prefix) / 'bin' / 'python3'
    created = run([base_python, '-m', 'venv', venv])
    assert created.returncode == 0, output(created)
    purelib = run([venv / 'bin' / 'python', '-c',
                   'import sysconfig; print(sysconfig.get_paths()["purelib"])']).stdout.strip()
    torch_site = user_torch_site(tmp / 'user_torch')
    (Path(purelib) / 'user_torch.pth').write_text(f'{torch_site}\n')
    env = dict(MST_MM_WHEEL_CACHE=str(tmp / 'empty_cache'),
               PIP_INDEX_URL='http://127.0.0.1:9/unreachable')
    start = time.monotonic()
    installed = run(['bash', SETUP, '--venv', venv, '--wheelhouse', wheelhouse, '--no-torch'],
                    **env)
    elapsed = time.monotonic() - start
    assert installed.returncode == 0, output(installed)
    return dict(venv=venv, purelib=Path(purelib), torch_site=torch_site, env=env,
                install=installed, install_s=elapsed, tmp=tmp)


def venv_python(state, code: str) -> str:
    result = run([state['venv'] / 'bin' / 'python', '-c', code])
    assert result.returncode == 0, output(result)
    return result.stdout.strip()


def flavour(state) -> str:
    return venv_python(state, f'import runpy; print(runpy.run_path({str(STACK_CHECK)!r})'
                              '["installed_mmcv_flavour"]())')


def stamp(state) -> dict:
    lines = (state['venv'] / '.mst_mm_stamp').read_text().splitlines()
    return dict(line.split(' ', 1) for line in lines)


@pytest.mark.network
@pytest.mark.slow
def test_offline_install_keeps_the_users_torch_and_passes_the_stack_check(offline_venv):
    state = offline_venv
    log = output(state['install'])
    # The stack check ran inside setup_env.sh: imports and one MST step with finite losses.
    assert '[stack_check] mmcv: mmcv 2.1.0 (lite, mmcv-lite)' in log
    assert '[stack_check] mst step: loss_dino' in log and 'student updated' in log
    assert 'building mmcv' not in log
    assert not (state['tmp'] / 'empty_cache').exists() or not any(
        (state['tmp'] / 'empty_cache').iterdir())
    assert stamp(state)['mmcv'] == 'lite' and stamp(state)['torch'] == 'own'
    assert flavour(state) == 'lite'
    # torch and torchvision are the user's, untouched; numpy < 2 came from the wheelhouse.
    torch_file = venv_python(state, 'import torch, torchvision; print(torch.__file__); '
                                    'print(torchvision.__file__)').splitlines()
    assert all(f.startswith(str(state['torch_site'])) for f in torch_file), torch_file
    assert not list(state['purelib'].glob('torch-*.dist-info'))
    numpy_file, numpy_version = venv_python(
        state, 'import numpy; print(numpy.__file__); print(numpy.__version__)').splitlines()
    assert numpy_file.startswith(str(state['purelib'])) and numpy_version.startswith('1.')
    # mst_mm is the editable checkout, found from outside the repository.
    assert venv_python(state, 'import mst_mm; print(mst_mm.__file__)') == str(
        REPO / 'mst_mm' / '__init__.py')


@pytest.mark.network
@pytest.mark.slow
def test_second_run_finds_the_environment_up_to_date(offline_venv):
    state = offline_venv
    start = time.monotonic()
    # No --no-torch and no wheelhouse: the stamp keeps the user's torch, and nothing installs.
    again = run(['bash', SETUP, '--venv', state['venv']], **state['env'])
    elapsed = time.monotonic() - start
    assert again.returncode == 0, output(again)
    assert 'environment up to date' in again.stderr and 'torch own' in again.stderr
    assert elapsed < 10, f'{elapsed:.1f} s'


@pytest.mark.network
@pytest.mark.slow
def test_lite_stack_refuses_ops_with_the_fix(offline_venv):
    result = run([offline_venv['venv'] / 'bin' / 'python', str(STACK_CHECK), '--ops'])
    assert result.returncode == 1
    assert 'mmcv-lite has no compiled ops' in result.stderr
    assert 'setup_env.sh --ops' in result.stderr


def compiled_mmcv_wheel() -> Path:
    """The compiled mmcv that setup_env.sh --ops built for this interpreter's torch."""
    cache = Path(os.environ.get('MST_MM_WHEEL_CACHE',
                                Path.home() / '.cache' / 'mst_mm' / 'wheels'))
    tag = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    wheels = sorted(cache.glob(f'mmcv-2.1.0-{tag}-*.whl'))
    if not wheels:
        pytest.skip(f'no compiled mmcv wheel for {tag} in {cache}: '
                    'run bash tools/setup_env.sh --ops first')
    return wheels[0]


def venv_has(state, distribution: str) -> bool:
    return venv_python(state, 'import importlib.metadata as md\n'
                              f'try:\n    md.version({distribution!r}); print(1)\n'
                              'except md.PackageNotFoundError:\n    print(0)') == '1'


@pytest.mark.network
@pytest.mark.slow
def test_ops_replaces_mmcv_lite_and_a_later_lite_run_keeps_it(offline_venv, wheelhouse):
    state = offline_venv
    mmcv_wheel = compiled_mmcv_wheel()
    # A wheelhouse without the compiled mmcv cannot give ops: a clear refusal, nothing changed.
    refused = run(['bash', SETUP, '--venv', state['venv'], '--wheelhouse', wheelhouse, '--ops'],
                  **state['env'])
    assert refused.returncode == 2, output(refused)
    assert 'has no compiled mmcv-2.1.0' in refused.stderr and '--mmcv ops' in refused.stderr
    assert venv_has(state, 'mmcv-lite') and flavour(state) == 'lite'

    # The same wheelhouse plus the compiled mmcv: mmcv-lite out, mmcv with ops in.
    with_ops = state['tmp'] / 'wh_ops'
    with_ops.mkdir()
    for wheel in wheelhouse.glob('*.whl'):
        if not wheel.name.startswith('mmcv_lite-'):
            (with_ops / wheel.name).symlink_to(wheel)
    (with_ops / mmcv_wheel.name).symlink_to(mmcv_wheel)
    switched = run(['bash', SETUP, '--venv', state['venv'], '--wheelhouse', with_ops, '--ops'],
                   **state['env'])
    assert switched.returncode == 0, output(switched)
    assert 'uninstalling the installed mmcv (lite: mmcv-lite)' in switched.stderr
    assert '[stack_check] mmcv: mmcv 2.1.0 (ops, mmcv)' in switched.stdout
    assert 'mmdet 3.3.0' in switched.stdout and 'mmsegmentation 1.2.2' in switched.stdout
    assert flavour(state) == 'ops' and stamp(state)['mmcv'] == 'ops'
    assert venv_has(state, 'mmcv') and not venv_has(state, 'mmcv-lite')

    # Command 1 after command 2: the compiled mmcv serves both; nothing is reinstalled.
    demo_setup = run(['bash', SETUP, '--venv', state['venv']], **state['env'])
    assert demo_setup.returncode == 0, output(demo_setup)
    assert 'environment up to date' in demo_setup.stderr and 'mmcv ops' in demo_setup.stderr
    assert flavour(state) == 'ops'


@pytest.mark.slow
def test_wheelhouse_for_another_python_is_refused(tmp_path):
    wheelhouse = tmp_path / 'wh'
    wheelhouse.mkdir()
    (wheelhouse / 'placeholder-1.0-py3-none-any.whl').write_bytes(b'')
    (wheelhouse / 'wheelhouse.txt').write_text('python_version=3.99\ntorch=excluded\n')
    result = run(['bash', SETUP, '--venv', tmp_path / 'venv', '--wheelhouse', wheelhouse])
    assert result.returncode == 2
    assert 'collected for Python 3.99' in result.stderr
    assert f'--python-version 3.{sys.version_info[1]}' in result.stderr


@pytest.mark.parametrize('args, message', [
    (['--mmcv', 'full'], "--mmcv takes 'lite' or 'ops', not 'full'"),
    (['--python-version', '312'], "--python-version takes MAJOR.MINOR"),
    (['--mmcv', 'ops'], 'no compiled mmcv-2.1.0 wheel for'),
    ([], '--dest DIR is required'),
])
def test_collector_names_bad_arguments_before_downloading(tmp_path, args, message):
    dest = ['--dest', tmp_path / 'wh'] if args else []
    result = run(['bash', COLLECT, *dest, *args], MST_MM_WHEEL_CACHE=str(tmp_path / 'empty'))
    assert result.returncode == 2
    assert message in result.stderr
    assert not list(tmp_path.glob('wh/*.whl'))


def test_setup_env_names_unknown_arguments(tmp_path):
    result = run(['bash', SETUP, '--venv', tmp_path / 'venv', '--wheel-house', 'x'])
    assert result.returncode == 2 and "unknown argument '--wheel-house'" in result.stderr
    assert not (tmp_path / 'venv').exists()
