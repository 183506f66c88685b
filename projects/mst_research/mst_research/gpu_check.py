"""The GPU check (projects/mst_research/tools/check_gpu.py): what the CPU test suite cannot
show, in one report.
Each step is a child process with a time limit cut to what the budget has left; what needs the
stack under test (there only once step 1 installed it) runs in the child interpreter too, as
``python -m mst_research.gpu_check PART JSON``, so that this process needs only the standard
library (and ``packaging`` for ``--wheels``).
"""
import contextlib
import json
import os
import os.path as osp
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import REPO

# Seconds per step (on a GPU, in a dry run); docs/install.md has what each takes on a GPU.
LIMITS = dict(install=(90, 60), cuda_quick=(90, 90), cuda_runs=(180, 90), reference=(150, 120),
              loader=(75, 60), learn=(150, 120), prepare=(240, 240))
BENCH = ('--models deit-s --device cuda --amp --dtypes bfloat16 float16 --batch-size 128 '
         '--repeats 5 --warmup 2',
         '--models tiny --device cpu --no-amp --batch-size 2 --repeats 1 --warmup 0 --threads 1')
LOADER = ('--workers 8 15 --batch-size 128', '--workers 1 --batch-size 4')
DINO_FILES = ('main_dino.py', 'utils.py', 'vision_transformer.py')
TOOL_RUNS = 'train_py or dist_train'   # tests/test_cuda.py's tool runs, split off by name


def nvidia_smi(query: str) -> str:
    """``nvidia-smi --query-gpu=QUERY``, a line per GPU joined by ';'; '' without it."""
    return shutil.which('nvidia-smi') and subprocess.run(
        ['nvidia-smi', f'--query-gpu={query}', '--format=csv,noheader'], capture_output=True,
        text=True).stdout.strip().replace('\n', ';') or ''


def gpu_peak_tflops() -> Optional[float]:
    """NVIDIA's dense float16/bfloat16 tensor-core peak of the first GPU, if known."""
    name = nvidia_smi('name').split(';')[0]
    if re.search('H100.*PCIe', name):
        return 756.0
    return 989.0 if re.search('H100|H200', name) else None


def cuda_available() -> bool:
    """Whether torch sees a CUDA device, asked in a child: this process never imports torch."""
    return subprocess.run([sys.executable, '-c', 'import sys, torch; '
                           'sys.exit(not torch.cuda.is_available())']).returncode == 0


def wait_or_kill(process: subprocess.Popen, limit: float) -> int:
    """The child's exit status, or 124 after ``limit`` seconds, when its whole process group
    is killed, as `timeout` does: pytest's tool runs and dist_train's ranks go with it."""
    try:
        return process.wait(timeout=max(limit, 0))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):   # the group has ended meanwhile
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 124


class GPUCheck:
    """The steps and the report for the kit's tools/check_gpu.py options; :meth:`run` returns the
    exit
    status: 0 every step passed or was not available, 1 one failed or ran out of time."""

    def __init__(self, args: Namespace) -> None:
        self.args, self.dry_run, self.env = args, args.dry_run, dict(os.environ)
        self.report, self.epochs = osp.abspath(args.report), 1 if args.dry_run else args.epochs
        self.logs = osp.join(osp.dirname(self.report), 'check_gpu_logs')   # every step's
        self.start, self.status, self.summary = time.monotonic(), 0, []

    def log(self, name: str) -> str:
        return osp.join(self.logs, name)

    def text(self, name: str) -> str:
        return Path(self.log(name)).read_text() if osp.isfile(self.log(name)) else ''

    def say(self, *lines: str, mode: str = 'a') -> None:
        with open(self.report, mode) as f:
            f.write(''.join(line + '\n' for line in lines or ('', )))

    def block(self, name: str, lines: int) -> None:
        self.say('```', *(self.text(name).splitlines()[-lines:] or [f'(no {name})']), '```')

    def record(self, name: str, verdict: str, failed: bool, seconds: int = 0,
               limit: int = 0) -> None:
        self.summary.append(f'| {name} | {verdict} | {seconds} | {limit} |')
        self.status = self.status or int(failed)

    def child(self, cmd: List[str], log: str, **env: str) -> subprocess.Popen:
        """``cmd`` in a process group of its own (:func:`wait_or_kill`), its output in ``log``."""
        with open(self.log(log), 'w') as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                    env=dict(self.env, **env), start_new_session=True)

    def part(self, name: str, **kwargs) -> List[str]:
        return [sys.executable, '-W', 'ignore', '-m', __name__, name, json.dumps(kwargs)]

    def step(self, name: str, kind: str, log: str, cmd: List[str], **env: str) -> None:
        """``cmd`` under the limit of its ``kind`` (:data:`LIMITS`) cut to the budget left, so
        that the check ends in time however the steps before went."""
        limit = min(LIMITS[kind][self.dry_run],
                    int(self.args.budget - (time.monotonic() - self.start) - 10))
        if limit < 20:
            self.say(f'- **not run**: the budget of {self.args.budget} s is spent')
            return self.record(name, 'not run (budget spent)', True)
        print(f'== {name} (limit {limit} s)', flush=True)
        started = time.monotonic()
        code = wait_or_kill(self.child(cmd, log, **env), limit)
        verdict = {0: 'passed', 124: f'TIMED OUT (limit {limit} s)'}.get(code,
                                                                       f'FAILED (exit {code})')
        seconds = round(time.monotonic() - started)
        self.say(f'- {verdict} in {seconds} s (limit {limit} s); log: check_gpu_logs/{log}')
        self.record(name, verdict, code != 0, seconds, limit)
        print(f'   {verdict} in {seconds} s', flush=True)

    def run(self) -> int:
        args = self.args
        shutil.rmtree(self.logs, ignore_errors=True)   # no stale log passes for this run's
        os.makedirs(self.logs)
        commit = shutil.which('git') and subprocess.run(['git', 'rev-parse', '--short', 'HEAD'],
                                                        cwd=REPO, capture_output=True,
                                                        text=True).stdout.strip()
        gpu = nvidia_smi('name,memory.total,driver_version') or 'none seen by nvidia-smi'
        self.say(f"# GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", '',
                 '- mode: ' + ('**dry run** on the CPU at tiny sizes: it exercises the check; '
                               'no figure below means anything' if self.dry_run else 'GPU'),
                 f"- commit: {commit or 'unknown (no git here)'}",
                 f"- GPU: {gpu}; torch device: {'cpu' if self.dry_run else 'cuda'}",
                 f'- CPU cores: {os.cpu_count()}; budget: {args.budget} s; peak for the MFU: '
                 f"{args.peak_tflops or 'unknown'} TFLOP/s", '', mode='w')
        self.stack()
        # The learning run's config and images (CPU work) are written while the GPU works.
        work_dir, batch = self.log('learning_run'), 8 if self.dry_run else 64
        prepare = self.child(self.part(
            'prepare', data=osp.join(args.scratch, 'animal_shapes'), work_dir=work_dir,
            dry_run=self.dry_run, epochs=self.epochs, batch=batch,
            workers=0 if self.dry_run else 8), 'learning_prepare.log')
        prepared_by = time.monotonic() + LIMITS['prepare'][self.dry_run]
        self.cuda_tests()
        self.reference_step()
        self.loader()
        self.learning_run(wait_or_kill(prepare, prepared_by - time.monotonic()), work_dir, batch)
        self.say('## Summary', '', '| step | verdict | seconds | limit (s) |',
                 '| --- | --- | --- | --- |', *self.summary, '',
                 f'Total: {round(time.monotonic() - self.start)} s of a budget of '
                 f'{args.budget} s; exit status {self.status}.')
        if args.copy_to:   # the report, and every log and JSON but no checkpoint
            os.makedirs(args.copy_to, exist_ok=True)
            shutil.copy(self.report, args.copy_to)
            with tarfile.open(osp.join(args.copy_to, 'check_gpu_logs.tgz'), 'w:gz') as tar:
                tar.add(self.logs, arcname='check_gpu_logs',
                        filter=lambda info: None if info.name.endswith('.pth') else info)
        print(f'check_gpu: report in {self.report} ({round(time.monotonic() - self.start)} s)')
        return self.status

    def stack(self) -> None:
        self.say('## 1. Stack', '')
        path = [REPO, osp.join(REPO, 'projects', 'mst_research')]
        if self.args.wheels:
            site = osp.join(self.args.scratch, 'site')
            shutil.rmtree(site, ignore_errors=True)
            fit, left_out = installable_wheels(self.args.wheels)
            self.say(f'Installing {len(fit)} wheels from {self.args.wheels} into {site}, on '
                     'PYTHONPATH after the repository.')
            if left_out:
                self.say('Left out (not for this Python): '
                         + ' '.join(map(osp.basename, left_out)))
            # --target, not a venv: the stack goes on top of the node's own torch and numpy.
            self.step('install wheels', 'install', 'install.log', [
                sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check',
                '--no-index', '--no-deps', '--no-compile', '--no-cache-dir', '--target', site,
                *fit])
            # mmsegmentation installs a top-level `tests` package: the repository's must win.
            shutil.rmtree(osp.join(site, 'tests'), ignore_errors=True)
            path.append(site)
        else:
            self.say(f'The environment as it is: {sys.executable}.')
        self.env['PYTHONPATH'] = os.pathsep.join(filter(None, [*path, os.getenv('PYTHONPATH')]))
        wait_or_kill(self.child(self.part('stack'), 'stack.txt'), 60)
        self.say(self.text('stack.txt').rstrip(), '')

    def cuda_tests(self) -> None:
        self.say('## 2. CUDA tests: pytest -m cuda tests/test_cuda.py', '')
        # Two runs, so that a slow tool run cannot crowd out the kernels' tests; -k splits by
        # name, so that a test added to tests/test_cuda.py lands in one of the two.
        pytest = [sys.executable, '-m', 'pytest', '-m', 'cuda', 'tests/test_cuda.py', '-v',
                  '-rA', '-p', 'no:cacheprovider', '--durations=0']
        deselect = []
        if not self.args.all_cuda_tests:   # one train.py --amp run per backbone and dtype
            for test_id in ('float16-deit-s', 'bfloat16-swin-t'):
                deselect += ['--deselect', f'tests/test_cuda.py::test_train_py_amp[{test_id}]']
            self.say('Deselected to fit the budget: test_train_py_amp[float16-deit-s], '
                     '[bfloat16-swin-t] (CHECK_GPU_ALL_CUDA_TESTS=1 keeps them).', '')
        for name, kind, select, what in (
                ('in-process', 'quick', [f'not ({TOOL_RUNS})'], 'In-process: fused attention '
                 'kernels, device-resident masks, EMA and k-NN, Mask R-CNN, SETR.'),
                ('tool runs', 'runs', [TOOL_RUNS, *deselect], "The tools' runs: train.py "
                 '--amp, save/resume/continue, dist_train.sh with NCCL and SyncBN.')):
            self.say(what)
            self.step(f'cuda tests: {name}', f'cuda_{kind}', f'pytest_cuda_{kind}.log',
                      [*pytest, '-k', *select])
            self.pytest_summary(f'pytest_cuda_{kind}.log')
        if 'mmcv compiled ops: yes' not in self.text('stack.txt'):
            self.say('Mask R-CNN and SETR on the GPU did not run: mmcv here has no compiled '
                     'ops (mmcv-lite).', 'They need mmcv 2.1.0 built with CUDA ops against '
                     'this torch (docs/install.md).', '')

    def pytest_summary(self, log: str) -> None:
        """The tests as they ran, the skip reasons and counts, the slowest phases."""
        lines = self.text(log).splitlines()
        tests = [line.split(' [')[0].rstrip() for line in lines if re.match(
            r'tests/test_cuda\.py::.* (PASSED|FAILED|SKIPPED|ERROR|XFAIL)', line)]
        counts = [line for line in lines if re.match(
            r'(SKIPPED|FAILED|ERROR) |=+ .*(passed|failed|skipped|error|deselected)', line)]
        slowest = [line for line in lines if re.match(r'[0-9.]+s (call|setup|teardown) ', line)]
        self.say('```', *tests, *counts, '```', 'Slowest phases (seconds; for sizing the '
                 'budget):', '```', *(slowest[:8] or ['(none over 0.005 s)']), '```', '')

    def reference_step(self) -> None:
        self.say("## 3. DeiT-S step against DINO's reference step", '')
        if not self.args.dino:
            self.say('- **not run**: no DINO clone. Copy main_dino.py, utils.py and '
                     'vision_transformer.py of', '  facebookresearch/dino into work_dirs/dino, '
                     'or pass --dino DIR.', '')
            return self.record('DINO reference step', 'not run (no --dino)', False)
        peak = ['--peak-tflops', str(self.args.peak_tflops)] if self.args.peak_tflops else []
        self.say("DINO float16 autocast (its default); ours bfloat16 and float16; same "
                 'synthetic crops.')
        self.step('DINO reference step', 'reference', 'reference.log', [
            sys.executable, 'projects/mst_research/tools/benchmark.py',
            '--reference-dino', self.args.dino,
            *BENCH[self.dry_run].split(), *peak, '--out', self.log('reference.json')])
        lines = self.text('reference.log').splitlines()
        first = next((i for i, line in enumerate(lines) if '] batch ' in line), len(lines))
        self.say('', *(line for line in lines[first:] if not line.startswith((
            'docs/benchmarks.md row', 'written to')) and ': | ' not in line), '')

    def loader(self) -> None:
        self.say('## 4. Data loader against the step', '')
        # PYTHONWARNINGS: mmcv-lite's and pkg_resources' warnings would bury its table.
        self.step('data loader', 'loader', 'loader.log', [
            sys.executable, self.args.loader_tool, *LOADER[self.dry_run].split(), '--out',
            self.log('loader.json')], PYTHONWARNINGS='ignore')
        self.block('loader.log', 25)
        self.say(*loader_against_step(self.log('loader.json'), self.log('reference.json')), '')

    def learning_run(self, prepared: int, work_dir: str, batch: int) -> None:
        self.say('## 5. Learning run: the evidence recipe with the k-NN probe', '')
        if prepared != 0:
            self.say(f'- its config or data could not be written (exit {prepared}):')
            self.block('learning_prepare.log', 15)
            return self.record('learning run', f'FAILED (config or data, exit {prepared})', True)
        images = self.text('learning_prepare.log').splitlines()[-1]
        self.say(f'MST-guided, seed 0, {self.epochs} epoch(s), batch {batch}, {images}.')
        self.step('learning run', 'learn', 'learning_run.log', [
            sys.executable, 'tools/train.py', osp.join(work_dir, 'run_config.py'),
            '--work-dir', work_dir])
        # The precision that the config's optim_wrapper chose on this device (its log line).
        precision = re.search(r'Training in (mixed precision, [a-z0-9]+|float32)',
                              self.text('learning_run.log'))
        self.say('- ' + (precision[0] if precision else
                         'Training in float32 (the config asks for nothing else)'))
        result = subprocess.run(self.part('learning_report', work_dir=work_dir, batch=batch,
                                          epochs=self.epochs),
                                capture_output=True, text=True, cwd=REPO, env=self.env)
        self.say((result.stdout + result.stderr).rstrip(), '')


def installable_wheels(folder: str) -> Tuple[List[str], List[str]]:
    """The wheels of ``folder`` that this interpreter installs, and the others (in a dry run
    on another Python, the compiled cp312 ones)."""
    from packaging.tags import sys_tags  # pip's own dependency: only where it installs
    from packaging.utils import parse_wheel_filename
    wheels = sorted(map(str, Path(folder).glob('*.whl')))
    fit = [w for w in wheels if set(sys_tags()) & set(parse_wheel_filename(osp.basename(w))[3])]
    return fit, [w for w in wheels if w not in fit]


def loader_against_step(loader_json: str, reference_json: str) -> List[str]:
    """The loader's images/s with each number of workers against the steps' (step 3)."""
    if not osp.isfile(loader_json):
        return ['- no loader figures']
    steps: Dict[str, float] = {}
    if osp.isfile(reference_json):
        for model in json.loads(Path(reference_json).read_text())['models'].values():
            steps = dict(model['images_per_second'])
    lines = []
    for row in json.loads(Path(loader_json).read_text())['loader']:
        ratios = ', '.join(f"{row['images_per_second'] / s:.2f} x the {name} step"
                           for name, s in steps.items())
        lines.append(f"- loader, {row['workers']} workers: {row['images_per_second']:.1f} "
                     'images/s' + (f'; {ratios}' if ratios else ''))
    return lines


# ---------------- the parts that run in the interpreter under test (hence the local imports)
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
    ops = spec and any(f.startswith('_ext') for f in os.listdir(osp.dirname(spec.origin)))
    print(f"- mmcv compiled ops: {'yes' if ops else 'no (mmcv-lite): Mask R-CNN and SETR skip'}")
    import torch
    print(f'- CUDA: {torch.version.cuda}, available: {torch.cuda.is_available()}')


def prepare_learning_run(data: str, work_dir: str, dry_run: bool, epochs: int, batch: int,
                         workers: int) -> None:
    """The evidence row's config (data root, seed, schedule, k-NN probe) for tools/train.py,
    and its object images; in a dry run from 4 real silhouettes a class."""
    import gzip
    import pickle

    import numpy as np

    from .data import DATA_FILES, load_silhouettes, write_object_images
    from .recipes import VIT_CONFIG, pretrain_config
    cfg = pretrain_config(VIT_CONFIG, 'mst_guided_mask', 0,
                          dict(epochs=epochs, batch_size=batch), data, work_dir)
    cfg.train_dataloader.update(num_workers=workers, persistent_workers=workers > 0)
    os.makedirs(work_dir, exist_ok=True)
    cfg.dump(osp.join(work_dir, 'run_config.py'))
    package = osp.join(data, 'package') if dry_run else None   # laid out as the package's
    if dry_run:
        images, labels = load_silhouettes()
        keep = np.concatenate([np.flatnonzero(labels == c)[:4] for c in range(10)])
        os.makedirs(osp.join(package, 'data', 'Animal Shape'), exist_ok=True)
        for name, array in zip(DATA_FILES, (images[keep], labels[keep])):
            with gzip.open(osp.join(package, 'data', 'Animal Shape', name), 'wb') as f:
                pickle.dump(array, f)
    written = write_object_images(osp.join(data, 'objects'), package_dir=package,
                                  **(dict(test_per_class=1) if dry_run else {}))
    print(f"{written['train']} training and {written['test']} held-out animal images")


def report_learning(work_dir: str, batch: int, epochs: int) -> None:
    """What the run logged, also after a timeout, against the committed CPU figures."""
    from .report import read_scalars
    try:
        rows = read_scalars(work_dir)
    except FileNotFoundError as error:
        print(f'- nothing logged: {error}')
        return
    probe, losses, times = ([r[key] for r in rows if key in r]
                            for key in ('knn_probe_top1_k20', 'loss_dino', 'time'))
    print(f'- k-NN probe (top-1 %, k = 20) after epochs 0..{len(probe) - 1}: '
          + ', '.join(f'{v:.2f}' for v in probe))
    if losses:
        print(f'- loss_dino: first {losses[0]:.3f}, last {losses[-1]:.3f} '
              f'({len(losses)} iterations)')
    if times:
        step = statistics.median(times)
        print(f'- {step * 1000:.1f} ms per iteration (median), {batch / step:.0f} images/s')
    cpu = json.loads(Path(REPO, 'docs', 'results', 'evidence_summary.json').read_text())
    for name, key, ours in (('k-NN', 'knn_top1', probe),
                            ('last loss_dino', 'last_loss_dino', losses)):
        values = cpu[key]['mst_guided_mask']
        mean, std = statistics.mean(values), statistics.stdev(values)
        this_run = (f'; this run: {ours[-1]:.3f}, {(ours[-1] - mean) / std:+.1f} std from the '
                    'CPU mean') if ours and len(probe) - 1 == epochs == 6 else ''
        print(f'- CPU {name}, mst_guided_mask, 6 epochs, {len(values)} seeds '
              f'(docs/results/evidence_summary.json): {mean:.3f} +- {std:.3f}{this_run}')
    if len(probe) - 1 != 6:
        print(f'- epochs probed: {len(probe) - 1}; the CPU figures are for the full 6-epoch '
              "schedule (docs/evidence.md has one seed's curve by epoch)")


PARTS = dict(stack=print_stack, prepare=prepare_learning_run, learning_report=report_learning)

if __name__ == '__main__':   # GPUCheck.part: a part and its keyword arguments as JSON
    PARTS[sys.argv[1]](**json.loads(sys.argv[2]))
