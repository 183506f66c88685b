"""The GPU check: on a GPU node, everything the CPU test suite cannot show, in one report.

1. the stack: optionally installed from a folder of wheels (an air-gapped node), its
   versions, and whether mmcv has its compiled ops;
2. ``pytest -m cuda tests/test_cuda.py`` in two runs: the in-process tests, then the tools'
   runs (``train.py --amp``, save/resume, ``dist_train.sh`` with NCCL and SyncBN);
3. our DeiT-S step against DINO's own (``tools/analysis/benchmark.py --reference-dino``);
4. the data loader's images/s against the step's (``tools/analysis/benchmark_loader.py``);
5. a short learning run of the evidence recipe with its k-NN probe, against the CPU figures.

Every step runs as a child process with a time limit, cut to what the budget has left. The
parts that need the stack under test run in the child interpreter as
``python -m mst_research.gpu_check PART ...``; this module imports only the standard library.
"""
import glob
import json
import os
import os.path as osp
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, Optional

from . import REPO

# Seconds per step on a GPU (docs/install.md has what each takes), and in a dry run.
LIMITS = dict(gpu=dict(install=90, cuda_quick=90, cuda_runs=180, reference=150, loader=75,
                       learn=150),
              dry_run=dict(install=60, cuda_quick=90, cuda_runs=90, reference=120, loader=60,
                           learn=120))
DINO_FILES = ('main_dino.py', 'utils.py', 'vision_transformer.py')
TOOL_RUNS = 'train_py or dist_train'   # tests/test_cuda.py's tool runs, split off by name
LOGS = ('install.log', 'stack.txt', 'pytest_cuda_quick.log', 'pytest_cuda_runs.log',
        'reference.log', 'reference.json', 'loader.log', 'loader.json', 'learning_data.log',
        'learning_config.log', 'learning_run.log')


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def gpu_peak_tflops() -> Optional[float]:
    """NVIDIA's dense float16/bfloat16 tensor-core peak of the first GPU, if known."""
    name = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                          capture_output=True, text=True).stdout if shutil.which(
                              'nvidia-smi') else ''
    if 'H100' in name and 'PCIe' in name:
        return 756.0
    return 989.0 if 'H100' in name or 'H200' in name else None


class GPUCheck:
    """The five steps and the report; :meth:`run` returns the exit status (0 every step
    passed or was not available, 1 one failed or ran out of time)."""

    def __init__(self, report: str, budget: int, dry_run: bool, peak: Optional[float],
                 wheels: Optional[str], dino: Optional[str], scratch: str,
                 copy_to: Optional[str], all_cuda_tests: bool = False,
                 loader_tool: Optional[str] = None, epochs: int = 6) -> None:
        self.log_dir = osp.dirname(osp.abspath(report))
        self.report = osp.abspath(report)
        self.budget, self.dry_run, self.peak = budget, dry_run, peak
        self.wheels, self.dino, self.scratch, self.copy_to = wheels, dino, scratch, copy_to
        self.all_cuda_tests = all_cuda_tests
        self.loader_tool = loader_tool or 'tools/analysis/benchmark_loader.py'
        self.epochs = 1 if dry_run else epochs
        self.limits = LIMITS['dry_run' if dry_run else 'gpu']
        self.env = dict(os.environ)
        self.start, self.status, self.summary = time.monotonic(), 0, []

    # ------------------------------------------------------------------------ report
    def say(self, *lines: str) -> None:
        with open(self.report, 'a') as f:
            f.write(''.join(line + '\n' for line in lines or ('', )))

    def block(self, log: str, lines: int = 40) -> None:
        path = osp.join(self.log_dir, log)
        text = read(path).splitlines()[-lines:] if osp.isfile(path) else [f'(no {log})']
        self.say('```', *text, '```')

    def step(self, name: str, limit: int, log: str, cmd: List[str]) -> int:
        """``cmd`` under a time limit cut to the budget left, its output in ``log``."""
        left = int(self.budget - (time.monotonic() - self.start) - 10)
        if left < 20:
            self.say(f'- **not run**: the budget of {self.budget} s is spent')
            self.summary.append(f'| {name} | not run (budget spent) | 0 | 0 |')
            self.status = 1
            return 1
        limit = min(limit, left)
        print(f'== {name} (limit {limit} s)', flush=True)
        started = time.monotonic()
        with open(osp.join(self.log_dir, log), 'w') as out:
            try:
                code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                      env=self.env, timeout=limit).returncode
                verdict = 'passed' if code == 0 else f'FAILED (exit {code})'
            except subprocess.TimeoutExpired:
                code, verdict = 124, f'TIMED OUT (limit {limit} s)'
        self.status = self.status or int(code != 0)
        elapsed = round(time.monotonic() - started)
        self.say(f'- {verdict} in {elapsed} s (limit {limit} s); log: {log}')
        self.summary.append(f'| {name} | {verdict} | {elapsed} | {limit} |')
        print(f'   {verdict} in {elapsed} s', flush=True)
        return code

    def part(self, *args: str) -> List[str]:
        return [sys.executable, '-W', 'ignore', '-m', 'mst_research.gpu_check', *args]

    # ------------------------------------------------------------------------- steps
    def run(self) -> int:
        os.makedirs(self.scratch, exist_ok=True)
        for name in LOGS:
            if osp.isfile(osp.join(self.log_dir, name)):
                os.remove(osp.join(self.log_dir, name))
        shutil.rmtree(osp.join(self.log_dir, 'learning_run'), ignore_errors=True)
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO,
                                capture_output=True, text=True).stdout.strip()
        gpu = subprocess.run(['nvidia-smi', '--query-gpu=name,memory.total,driver_version',
                              '--format=csv,noheader'], capture_output=True, text=True
                             ).stdout.strip().replace('\n', ';') if shutil.which(
                                 'nvidia-smi') else ''
        with open(self.report, 'w') as f:
            f.write(f"# GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n")
        self.say('- mode: ' + ('**dry run** on the CPU at tiny sizes: it exercises the check; '
                               'no figure below means anything' if self.dry_run else 'GPU'),
                 f"- commit: {commit or 'unknown (no git here)'}",
                 f"- GPU: {gpu or 'none seen by nvidia-smi'}; torch device: "
                 f"{'cpu' if self.dry_run else 'cuda'}",
                 f'- CPU cores: {os.cpu_count()}; budget: {self.budget} s; peak for the MFU: '
                 f"{self.peak or 'unknown'} TFLOP/s", '')
        self.stack()
        data = osp.join(self.scratch, 'animal_shapes')
        # The learning run's images (CPU work) are written while the GPU steps run.
        with open(osp.join(self.log_dir, 'learning_data.log'), 'w') as log:
            writer = subprocess.Popen(self.part('data', data, str(int(self.dry_run))),
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                      env=self.env)
        self.cuda_tests()
        self.reference_step()
        self.loader()
        self.learning_run(data, writer)
        self.say('## Summary', '', '| step | verdict | seconds | limit (s) |',
                 '| --- | --- | --- | --- |', *self.summary, '',
                 f'Total: {round(time.monotonic() - self.start)} s of a budget of '
                 f'{self.budget} s; exit status {self.status}.')
        if self.copy_to:
            os.makedirs(self.copy_to, exist_ok=True)
            shutil.copy(self.report, self.copy_to)
            with tarfile.open(osp.join(self.copy_to, 'check_gpu_logs.tgz'), 'w:gz') as tar:
                tar.add(self.log_dir, arcname='.',
                        filter=lambda info: None if info.name.endswith('.pth') else info)
        print(f'check_gpu: report in {self.report} ({round(time.monotonic() - self.start)} s)')
        return self.status

    def stack(self) -> None:
        self.say('## 1. Stack', '')
        path = [REPO, osp.join(REPO, 'projects', 'mst_research')]
        if self.wheels:
            site = osp.join(self.scratch, 'site')
            shutil.rmtree(site, ignore_errors=True)
            fit, left_out = installable_wheels(self.wheels)
            self.say(f'Installing {len(fit)} wheels from {self.wheels} into {site}, on '
                     'PYTHONPATH after the repository.')
            if left_out:
                self.say('Left out (not for this Python): '
                         + ' '.join(osp.basename(w) for w in left_out))
            self.step('install wheels', self.limits['install'], 'install.log',
                      [sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check',
                       '--no-index', '--no-deps', '--no-compile', '--no-cache-dir',
                       '--target', site, *fit])
            # mmsegmentation installs a top-level `tests` package: the repository's must win.
            shutil.rmtree(osp.join(site, 'tests'), ignore_errors=True)
            path.append(site)
        else:
            self.say(f'The environment as it is: {sys.executable}.')
        self.env['PYTHONPATH'] = os.pathsep.join(path + [p for p in [
            os.environ.get('PYTHONPATH')] if p])
        with open(osp.join(self.log_dir, 'stack.txt'), 'w') as out:
            subprocess.run(self.part('stack'), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                           env=self.env, timeout=60)
        self.say(read(osp.join(self.log_dir, 'stack.txt')).rstrip(), '')

    def cuda_tests(self) -> None:
        self.say('## 2. CUDA tests: pytest -m cuda tests/test_cuda.py', '')
        args = [sys.executable, '-m', 'pytest', '-m', 'cuda', 'tests/test_cuda.py', '-v', '-rA',
                '-p', 'no:cacheprovider', '--durations=0']
        deselect = []
        if not self.all_cuda_tests:   # one train.py --amp run per backbone and dtype fits
            for test_id in ('float16-deit-s', 'bfloat16-swin-t'):
                deselect += ['--deselect', f'tests/test_cuda.py::test_train_py_amp[{test_id}]']
            self.say('Deselected to fit the budget: test_train_py_amp[float16-deit-s], '
                     '[bfloat16-swin-t] (--all-cuda-tests keeps them).', '')
        self.say('In-process: fused attention kernels, device-resident masks, EMA and k-NN, '
                 'Mask R-CNN, SETR.')
        self.step('cuda tests: in-process', self.limits['cuda_quick'], 'pytest_cuda_quick.log',
                  [*args, '-k', f'not ({TOOL_RUNS})'])
        self.pytest_summary('pytest_cuda_quick.log')
        self.say('', "The tools' runs: train.py --amp, save/resume/continue, dist_train.sh with "
                 'NCCL and SyncBN.')
        self.step('cuda tests: tool runs', self.limits['cuda_runs'], 'pytest_cuda_runs.log',
                  [*args, '-k', TOOL_RUNS, *deselect])
        self.pytest_summary('pytest_cuda_runs.log')
        if 'mmcv compiled ops: yes' not in read(osp.join(self.log_dir, 'stack.txt')):
            self.say('Mask R-CNN and SETR on the GPU did not run: mmcv here has no compiled '
                     'ops (mmcv-lite).', 'They need mmcv 2.1.0 built with CUDA ops against '
                     'this torch (docs/install.md).')
        self.say()

    def pytest_summary(self, log: str) -> None:
        """The tests as they ran, the skip reasons and counts, the slowest phases."""
        lines = read(osp.join(self.log_dir, log)).splitlines()
        tests = [line.split(' [')[0].rstrip() for line in lines if line.startswith(
            'tests/test_cuda.py::') and any(f' {v}' in line for v in (
                'PASSED', 'FAILED', 'SKIPPED', 'ERROR', 'XFAIL'))]
        counts = [line for line in lines if line.startswith(('SKIPPED ', 'FAILED ', 'ERROR '))
                  or (line.startswith('=') and any(w in line for w in (
                      'passed', 'failed', 'skipped', 'error', 'deselected')))]
        slowest = [line for line in lines
                   if re.match(r'^[0-9.]+s (call|setup|teardown) ', line)][:8]
        self.say('```', *tests, *counts, '```', 'Slowest phases (seconds; for sizing the '
                 'budget):', '```', *(slowest or ['(none over 0.005 s)']), '```')

    def reference_step(self) -> None:
        self.say("## 3. DeiT-S step against DINO's reference step", '')
        if not self.dino:
            self.say('- **not run**: no DINO clone. Copy main_dino.py, utils.py and '
                     'vision_transformer.py of', '  facebookresearch/dino into work_dirs/dino, '
                     'or pass --dino DIR.', '')
            self.summary.append('| DINO reference step | not run (no --dino) | 0 | 0 |')
            return
        if self.dry_run:
            bench = ['--models', 'tiny', '--device', 'cpu', '--no-amp', '--batch-size', '2',
                     '--repeats', '1', '--warmup', '0', '--threads', '1']
        else:
            bench = ['--models', 'deit-s', '--device', 'cuda', '--amp', '--dtypes', 'bfloat16',
                     'float16', '--batch-size', '128', '--repeats', '5', '--warmup', '2',
                     *(['--peak-tflops', str(self.peak)] if self.peak else [])]
        self.say("DINO float16 autocast (its default); ours bfloat16 and float16; same "
                 'synthetic crops.')
        self.step('DINO reference step', self.limits['reference'], 'reference.log',
                  [sys.executable, 'tools/analysis/benchmark.py', '--reference-dino',
                   self.dino, *bench, '--out', osp.join(self.log_dir, 'reference.json')])
        lines = read(osp.join(self.log_dir, 'reference.log')).splitlines()
        first = next((i for i, line in enumerate(lines) if '] batch ' in line), len(lines))
        self.say('', *(line for line in lines[first:] if not line.startswith((
            'docs/benchmarks.md row', 'written to')) and ': | ' not in line), '')

    def loader(self) -> None:
        self.say('## 4. Data loader against the step', '')
        size = ['--workers', '1', '--batch-size', '4'] if self.dry_run else \
            ['--workers', '8', '15', '--batch-size', '128']
        self.env['PYTHONWARNINGS'] = 'ignore'   # mmcv-lite's would bury the table
        self.step('data loader', self.limits['loader'], 'loader.log',
                  [sys.executable, self.loader_tool, *size, '--out',
                   osp.join(self.log_dir, 'loader.json')])
        del self.env['PYTHONWARNINGS']
        self.block('loader.log', 25)
        self.say(*loader_against_step(osp.join(self.log_dir, 'loader.json'),
                                      osp.join(self.log_dir, 'reference.json')), '')

    def learning_run(self, data: str, writer: subprocess.Popen) -> None:
        self.say('## 5. Learning run: the evidence recipe with the k-NN probe', '')
        batch, workers = ('8', '0') if self.dry_run else ('64', '8')
        work_dir = osp.join(self.log_dir, 'learning_run')
        code = writer.wait()
        if code != 0:
            self.say(f'- the data could not be written (exit {code}):')
            self.block('learning_data.log', 15)
            self.summary.append(f'| learning run | FAILED (data, exit {code}) | 0 | 0 |')
            self.status = 1
            return
        images = read(osp.join(self.log_dir, 'learning_data.log')).splitlines()[-1]
        self.say(f'MST-guided, seed 0, {self.epochs} epoch(s), batch {batch}, {images}.')
        with open(osp.join(self.log_dir, 'learning_config.log'), 'w') as out:
            subprocess.run(self.part('learning-config', data, work_dir, str(self.epochs), batch,
                                     workers), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                           env=self.env)
        config = osp.join(work_dir, 'run_config.py')
        if not osp.isfile(config):
            self.say("- the run's config could not be made (mst_research.recipes."
                     'pretrain_config):')
            self.block('learning_config.log', 15)
        self.step('learning run', self.limits['learn'], 'learning_run.log',
                  [sys.executable, 'tools/train.py', config, '--work-dir', work_dir])
        log = read(osp.join(self.log_dir, 'learning_run.log'))
        precision = re.search(r'Training in (mixed precision, [a-z0-9]+|float32)', log)
        self.say('- ' + (precision[0] if precision else
                         'Training in float32 (the config asks for nothing else)'))
        result = subprocess.run(self.part('learning-report', work_dir, batch, str(self.epochs)),
                                capture_output=True, text=True, cwd=REPO, env=self.env)
        self.say((result.stdout + result.stderr).rstrip(), '')


def installable_wheels(folder: str) -> tuple:
    """The wheels of ``folder`` that this interpreter installs, and the others."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename
    supported = set(sys_tags())
    wheels = sorted(glob.glob(osp.join(folder, '*.whl')))
    fit = [w for w in wheels if supported & set(parse_wheel_filename(osp.basename(w))[3])]
    return fit, [w for w in wheels if w not in fit]


def loader_against_step(loader_json: str, reference_json: str) -> List[str]:
    """The loader's images/s with each number of workers against the steps' (step 3)."""
    if not osp.isfile(loader_json):
        return ['- no loader figures']
    steps: Dict[str, float] = {}
    if osp.isfile(reference_json):
        for model in json.loads(read(reference_json))['models'].values():
            steps = dict(model['images_per_second'])
    lines = []
    for row in json.loads(read(loader_json))['loader']:
        line = f"- loader, {row['workers']} workers: {row['images_per_second']:.1f} images/s"
        if steps:
            line += '; ' + ', '.join(f"{row['images_per_second'] / s:.2f} x the {name} step"
                                     for name, s in steps.items())
        lines.append(line)
    return lines


# ------------------------------------- the parts that run in the interpreter under test
def print_stack() -> None:
    import importlib
    import importlib.util
    import platform
    print(f'- Python {platform.python_version()} at {sys.executable}')
    for name in ('torch', 'torchvision', 'numpy', 'mmengine', 'mmcv', 'mmpretrain', 'mmdet',
                 'mmseg', 'timm', 'mst_mm'):
        try:
            module = importlib.import_module(name)
            folder = osp.dirname(osp.dirname(module.__file__))
            print(f"- {name} {getattr(module, '__version__', '')} (from {folder})")
        except Exception as error:   # the report names whatever is missing
            print(f'- {name}: not importable ({type(error).__name__}: {error})')
    spec = importlib.util.find_spec('mmcv')   # mmcv-lite: the package without its _ext
    ops = spec is not None and any(f.startswith('_ext') for f in os.listdir(
        osp.dirname(spec.origin)))
    print(f"- mmcv compiled ops: {'yes' if ops else 'no (mmcv-lite): Mask R-CNN and SETR skip'}")
    import torch
    print(f'- CUDA: {torch.version.cuda}, available: {torch.cuda.is_available()}')


def write_data(data: str, dry_run: bool) -> None:
    """The learning run's object images; in a dry run 4 real silhouettes a class."""
    import gzip
    import pickle

    import numpy as np

    from .data import load_silhouettes, write_object_images
    package = None
    if dry_run:
        images, labels = load_silhouettes()
        keep = np.concatenate([np.flatnonzero(labels == c)[:4] for c in range(10)])
        package = osp.join(data, 'package')
        os.makedirs(osp.join(package, 'data', 'Animal Shape'), exist_ok=True)
        for name, array in (('animal_data_version_3.gz', images[keep]),
                            ('animal_label_version_3.gz', labels[keep])):
            with gzip.open(osp.join(package, 'data', 'Animal Shape', name), 'wb') as f:
                pickle.dump(array, f)
    written = write_object_images(osp.join(data, 'objects'), package_dir=package,
                                  **(dict(test_per_class=1) if dry_run else {}))
    print(f"{written['train']} training and {written['test']} held-out animal images")


def write_learning_config(data: str, work_dir: str, epochs: int, batch: int,
                          workers: int) -> None:
    """The evidence row's config (data root, seed, schedule, k-NN probe) for tools/train.py."""
    from .recipes import VIT_CONFIG, pretrain_config
    cfg = pretrain_config(VIT_CONFIG, 'mst_guided_mask', 0, dict(epochs=epochs,
                                                                 batch_size=batch),
                          data, work_dir)
    cfg.train_dataloader.num_workers = workers
    cfg.train_dataloader.persistent_workers = workers > 0
    os.makedirs(work_dir, exist_ok=True)
    cfg.dump(osp.join(work_dir, 'run_config.py'))


def report_learning(work_dir: str, batch: int, epochs: int) -> None:
    """What the run logged, also after a timeout, against the committed CPU figures."""
    from .report import read_scalars
    try:
        rows = read_scalars(work_dir)
    except FileNotFoundError as error:
        print(f'- nothing logged: {error}')
        return
    probe = [r['knn_probe_top1_k20'] for r in rows if 'knn_probe_top1_k20' in r]
    losses = [r['loss_dino'] for r in rows if 'loss_dino' in r]
    times = [r['time'] for r in rows if 'time' in r]
    print(f'- k-NN probe (top-1 %, k = 20) after epochs 0..{len(probe) - 1}: '
          + ', '.join(f'{v:.2f}' for v in probe))
    if losses:
        print(f'- loss_dino: first {losses[0]:.3f}, last {losses[-1]:.3f} '
              f'({len(losses)} iterations)')
    if times:
        step = statistics.median(times)
        print(f'- {step * 1000:.1f} ms per iteration (median), {batch / step:.0f} images/s')
    cpu = json.loads(read(osp.join(REPO, 'docs', 'results', 'evidence_summary.json')))
    for name, key, gpu in (('k-NN', 'knn_top1', probe[-1] if probe else None),
                           ('last loss_dino', 'last_loss_dino', losses[-1] if losses else None)):
        values = cpu[key]['mst_guided_mask']
        mean, std = statistics.mean(values), statistics.stdev(values)
        where = ''
        if gpu is not None and len(probe) - 1 == epochs == 6:
            where = f'; this run: {gpu:.3f}, {(gpu - mean) / std:+.1f} std from the CPU mean'
        print(f'- CPU {name}, mst_guided_mask, 6 epochs, {len(values)} seeds '
              f'(docs/results/evidence_summary.json): {mean:.3f} +- {std:.3f}{where}')
    if len(probe) - 1 != 6:
        print(f'- epochs probed: {len(probe) - 1}; the CPU figures are for the full 6-epoch '
              "schedule (docs/evidence.md has one seed's curve by epoch)")


if __name__ == '__main__':
    part, args = sys.argv[1], sys.argv[2:]
    if part == 'stack':
        print_stack()
    elif part == 'data':
        write_data(args[0], args[1] == '1')
    elif part == 'learning-config':
        write_learning_config(args[0], args[1], *map(int, args[2:]))
    else:
        report_learning(args[0], int(args[1]), int(args[2]))
