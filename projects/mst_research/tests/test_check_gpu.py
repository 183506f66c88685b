"""The kit's tools/check_gpu.py (mst_research.gpu_check), its wrapper check_gpu.sh and the
repository's tools/collect_device_wheels.sh without a GPU: the check's dry run (every step's
CPU part at tiny sizes) writes a report with every section, its argument checks refuse bad input
with
status 2, and the wheels for an air-gapped GPU node stay small."""
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from kit_helpers import REPO, stand_in_dino

CHECK = [sys.executable, REPO / 'projects' / 'mst_research' / 'tools' / 'check_gpu.py']
WRAPPER = REPO / 'projects' / 'mst_research' / 'tools' / 'check_gpu.sh'
COLLECT = REPO / 'tools' / 'collect_device_wheels.sh'
SECTIONS = ('## 1. Stack', '## 2. CUDA tests: pytest -m cuda tests/test_cuda.py',
            "## 3. DeiT-S step against DINO's reference step",
            '## 4. Data loader against the step',
            '## 5. Learning run: the evidence recipe with the k-NN probe', '## Summary')
# A stand-in for the kit's tools/benchmark_loader.py (another tool, timed on the GPU): the
# check needs only its command line and the layout of its JSON.
STAND_IN_LOADER = '''
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument('--workers', type=int, nargs='+')
parser.add_argument('--batch-size', type=int)
parser.add_argument('--out')
args = parser.parse_args()
rows = [dict(workers=n, batch_size=args.batch_size, images_per_second=100.0 * (n + 1))
        for n in args.workers]
json.dump(dict(loader=rows), open(args.out, 'w'))
print('loader timed with', args.workers)
'''


def run(cmd, timeout=600, **env) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1')
    full_env.update(env)
    full_env.pop('CHECK_GPU_DRY_RUN', None)
    return subprocess.run([str(c) for c in cmd], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel that installs one empty module, as the device wheels do."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / 'mst_mm_probe_pkg-0.1-py3-none-any.whl'
    info = 'mst_mm_probe_pkg-0.1.dist-info'
    with zipfile.ZipFile(path, 'w') as wheel:
        wheel.writestr('mst_mm_probe_pkg.py', 'PROBE = 1\n')
        wheel.writestr(f'{info}/METADATA',
                       'Metadata-Version: 2.1\nName: mst-mm-probe-pkg\nVersion: 0.1\n')
        wheel.writestr(f'{info}/WHEEL',
                       'Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
        wheel.writestr(f'{info}/RECORD', '')
    return folder


@pytest.mark.slow
def test_dry_run_writes_every_section_of_the_report(tmp_path):
    dino = stand_in_dino(tmp_path / 'dino')
    loader = tmp_path / 'benchmark_loader.py'
    loader.write_text(STAND_IN_LOADER)
    wheels = tiny_wheel(tmp_path / 'wheels')
    report = tmp_path / 'check' / 'report.md'
    copy_to = tmp_path / 'out'
    result = run([*CHECK, '--dry-run', '--wheels', wheels, '--dino', dino,
                  '--report', report, '--copy-to', copy_to],
                 CHECK_GPU_SCRATCH=str(tmp_path / 'scratch'), CHECK_GPU_LOADER_TOOL=str(loader))
    text = report.read_text() if report.exists() else ''
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + text
    positions = [text.index(section) for section in SECTIONS]
    assert positions == sorted(positions), 'sections out of order'
    assert 'mode: **dry run**' in text
    # 1: the wheels installed into the scratch folder; the stack's versions
    assert '- passed in' in text.split('## 2.')[0] and '- torch ' in text
    assert (tmp_path / 'scratch' / 'site' / 'mst_mm_probe_pkg.py').is_file()
    # 2: the CUDA tests collected and skipped here, in two runs that split the file
    cuda = text.split('## 2.')[1].split('## 3.')[0]
    assert 'Deselected to fit the budget' in cuda
    assert '::test_knn_scores_on_the_device_equal_the_cpu_ones SKIPPED' in cuda
    assert '::test_train_py_amp[bfloat16-deit-s] SKIPPED' in cuda
    assert '::test_train_py_amp[float16-deit-s]' not in cuda
    assert len(re.findall(r'^=+ \d+ skipped', cuda, flags=re.M)) == 2
    # 3: the three steps' table from the stand-in DINO clone
    reference = text.split('## 3.')[1].split('## 4.')[0]
    for step in ('| reference_dino | off |', '| dino_mode | off |', '| mst | off |'):
        assert step in reference
    assert 'peak memory (GiB)' in reference
    # 4: the loader's figures against the step's
    assert '- loader, 1 workers: 200.0 images/s;' in text and 'x the mst step' in text
    # 5: the probe before and after the epoch, the loss, the CPU figures
    learning = text.split('## 5.')[1]
    assert 'k-NN probe (top-1 %, k = 20) after epochs 0..1:' in learning
    assert 'CPU k-NN, mst_guided_mask, 6 epochs, 3 seeds' in learning
    summary = text.split('## Summary')[1]
    for name in ('install wheels', 'cuda tests: in-process', 'cuda tests: tool runs',
                 'DINO reference step', 'data loader', 'learning run'):
        assert f'| {name} | passed |' in summary
    assert 'exit status 0' in summary
    # --copy-to: the report and the logs, copied
    assert (copy_to / 'report.md').read_text() == text
    assert (copy_to / 'check_gpu_logs.tgz').stat().st_size > 0


@pytest.mark.parametrize('args, message', [
    (['--budget', 'soon'], '--budget takes whole seconds'),
    (['--peak-tflops', 'fast'], '--peak-tflops takes a number'),
    (['--wheels', '/nonexistent/wheels'], 'collect_device_wheels.sh'),
    (['--no-such-option'], 'unrecognized arguments: --no-such-option'),
])
def test_check_gpu_refuses_bad_input_with_status_2(args, message):
    result = run([*CHECK, '--dry-run', *args], timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_check_gpu_refuses_a_dino_folder_without_dinos_modules(tmp_path):
    (tmp_path / 'main_dino.py').write_text('')
    result = run([*CHECK, '--dry-run', '--dino', tmp_path], timeout=60)
    assert result.returncode == 2 and 'lacks utils.py' in result.stderr, result.stderr


def test_the_wrapper_refuses_a_python_without_torch_with_status_2():
    result = run(['bash', WRAPPER, '--dry-run'], timeout=60, PYTHON='/nonexistent/python')
    assert result.returncode == 2 and 'imports torch' in result.stderr, result.stderr


@pytest.mark.parametrize('args, message', [
    (['--python-version', '3'], '--python-version takes MAJOR.MINOR'),
    (['--max-mib', 'lots'], '--max-mib takes a whole number'),
    (['--dest'], '--dest needs a value'),
])
def test_collect_device_wheels_refuses_bad_input_with_status_2(args, message):
    result = run(['bash', COLLECT, *args], timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.network
def test_device_wheels_stay_small_and_install_for_python_3_12(tmp_path):
    dest = tmp_path / 'wheels'
    collected = run(['bash', COLLECT, '--dest', dest], timeout=300)
    if collected.returncode != 0 and 'package index' in collected.stderr:
        pytest.skip('collecting the device wheels needs the package index: '
                    + collected.stderr.strip().splitlines()[-1])
    assert collected.returncode == 0, collected.stderr
    wheels = sorted(dest.glob('*.whl'))
    names = {w.name.split('-')[0].lower() for w in wheels}
    assert {'mmengine', 'mmpretrain', 'mmcv_lite', 'mmdet', 'mmsegmentation',
            'animal_shape_mnist'} <= names
    assert not names & {'torch', 'torchvision', 'numpy', 'mmcv'}   # the machine's own
    total = sum(w.stat().st_size for w in wheels)
    assert total <= 60 * 2**20 and collected.stdout.strip() == f'{-(-total // 2**20)} MiB'
    # Every wheel is one that CPython 3.12 on x86-64 Linux installs (pure, abi3 or cp312).
    from packaging.utils import parse_wheel_filename
    for wheel in wheels:
        tags = parse_wheel_filename(wheel.name)[3]
        assert any(t.interpreter in ('py3', 'py2.py3', 'cp312') or t.abi == 'abi3'
                   for t in tags), wheel.name
        assert all(t.platform in ('any',) or 'x86_64' in t.platform for t in tags), wheel.name


@pytest.mark.skipif(torch.cuda.is_available(), reason='on a GPU it runs the whole GPU check')
def test_check_gpu_sh_on_a_machine_without_cuda_says_so_and_exits_cleanly(tmp_path):
    report = tmp_path / 'report.md'
    result = subprocess.run(['bash', str(WRAPPER), str(report)],
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 0, result.stderr
    assert 'no CUDA device' in result.stdout and not report.exists()
