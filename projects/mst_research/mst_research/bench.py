"""Timing and statistics of the benchmarks (projects/mst_research/tools/benchmark*.py): interleaved
repetitions, ratios taken inside a repetition, FLOP counts, memory, the machine and commit a
figure comes from. It imports nothing of mst_mm at module level: ``recipe_speed``'s child
processes import it beside an older checkout's mst_mm.
"""
import json
import os
import os.path as osp
import platform
import resource
import statistics
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from . import REPO


def interleaved_times(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                      device: str) -> Tuple[Dict[str, List[float]], Dict[str, List[dict]]]:
    """Seconds of every repetition of each function, the order rotating every repetition,
    and what this process spent in each (``getrusage``: user and system CPU seconds, pages
    first touched), which other processes on a shared machine disturb far less."""
    for fn in list(fns.values()) * warmup:
        fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    usage: Dict[str, List[dict]] = {name: [] for name in fns}
    names = list(fns)
    sync = torch.cuda.synchronize if device.startswith('cuda') else lambda: None
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            sync()
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            fns[name]()
            sync()
            times[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_SELF)
            usage[name].append(dict(user=after.ru_utime - before.ru_utime,
                                    system=after.ru_stime - before.ru_stime,
                                    minor_faults=after.ru_minflt - before.ru_minflt))
    return times, usage


def interleaved_medians(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int,
                        device: str) -> Dict[str, float]:
    """Median seconds of each function, timed by :func:`interleaved_times`."""
    times, _ = interleaved_times(fns, repeats, warmup, device)
    return {name: statistics.median(t) for name, t in times.items()}


def step_figures(times: Dict[str, List[float]], usage: Dict[str, List[dict]]) -> dict:
    """What a result file keeps of :func:`interleaved_times`: per step the median seconds,
    their :func:`spread` and the medians of the CPU usage."""
    return dict(step_seconds={name: statistics.median(t) for name, t in times.items()},
                step_spread={name: spread(t) for name, t in times.items()},
                usage_per_step={name: {key: statistics.median(u[key] for u in reps)
                                       for key in reps[0]} for name, reps in usage.items()})


def usage_line(used: Dict[str, Dict[str, float]]) -> str:
    """The CPU usage of :func:`step_figures` in one printed line."""
    return 'per step, median: ' + ', '.join(
        f'{step} user {u["user"]:.3f} s, system {u["system"]:.3f} s, '
        f'{u["minor_faults"]:.0f} page faults' for step, u in used.items())


def ratio_over_repetitions(numerator: Sequence[float], denominator: Sequence[float]
                           ) -> Tuple[float, List[float]]:
    """median(numerator) / median(denominator), and [min, max] of the ratios taken inside
    each repetition: the spread that the machine's drift leaves in the ratio."""
    per_rep = [n / d for n, d in zip(numerator, denominator)]
    return (statistics.median(numerator) / statistics.median(denominator),
            [min(per_rep), max(per_rep)])


def spread(values: Sequence[float]) -> dict:
    """Median, min, max, (max - min) / median and every value of one figure's repetitions."""
    median = statistics.median(values)
    return dict(median=median, min=min(values), max=max(values),
                spread=(max(values) - min(values)) / median if median else None,
                all=list(values))


def range_cell(median: float, low: float, high: float, digits: int = 3) -> str:
    """'median (low-high)': a figure or a ratio as the docs' tables give it."""
    return f'{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})'


def median_range(figure: dict, digits: int = 3) -> str:
    """:func:`range_cell` of a :func:`spread` result."""
    return range_cell(figure['median'], figure['min'], figure['max'], digits)


def math_attention() -> AbstractContextManager:
    """A block where ``scaled_dot_product_attention`` runs on its math backend alone
    (``torch.nn.attention.sdpa_kernel`` from torch 2.3, ``torch.backends.cuda.sdp_kernel``
    before)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_math=True, enable_flash=False,
                                              enable_mem_efficient=False)
    return sdpa_kernel([SDPBackend.MATH])


def flops_of(fn: Callable[[], None]) -> int:
    """Floating-point operations of one call of ``fn`` (forward and backward), counted, with
    attention on the math backend: torch's counter counts the CPU's fused kernel as zero."""
    counter = FlopCounterMode(display=False)
    with math_attention(), counter:
        fn()
    return counter.get_total_flops()


def matmul_peak_gflops(size: int = 1024, repeats: int = 15) -> float:
    """Float32 matrix-product rate of this process (its torch threads), median of runs."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def state_bytes(modules: List[torch.nn.Module], optimizers: List[torch.optim.Optimizer],
                tensors: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the storages that a step keeps between calls (parameters, buffers,
    gradients, optimiser state) and of its inputs, each storage counted once."""
    found = list(tensors)
    for module in modules:
        found += list(module.parameters()) + list(module.buffers())
        found += [p.grad for p in module.parameters() if p.grad is not None]
    for optimizer in optimizers:
        found += [v for state in optimizer.state.values() for v in state.values()
                  if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in found}
    return sum(storages.values())


def peak_memory_gib(step: Callable[[], None], resident: int, device: str) -> Optional[float]:
    """GiB that one call of ``step`` needs on its own on a CUDA device: what it keeps
    (``resident`` bytes) plus what the call allocated above what was allocated before it
    (``torch.cuda.max_memory_allocated``), so that the other steps' models, resident at the
    same time, do not count. None on the CPU."""
    if not device.startswith('cuda'):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (resident + torch.cuda.max_memory_allocated() - before) / 2**30


def peak_resident_mib() -> float:
    """This process's peak resident memory since its exec (``VmHWM``). ``ru_maxrss`` would
    start from the parent's at the fork (Linux keeps it across ``execve``)."""
    with open('/proc/self/status') as f:
        line = next(line for line in f if line.startswith('VmHWM:'))
    return int(line.split()[1]) / 1024  # kB


def load_per_core() -> Optional[float]:
    """The 1-minute load average per core, or None where the system does not tell."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return None


def load_cell(results: dict) -> str:
    """The load per core before timing; runs up to commit 7082b6f kept it in a verdict."""
    load = results.get('load_per_core_before',
                       results.get('verdict', {}).get('load_per_core_before'))
    return 'n/a' if load is None else f'{load:.2f}'


def machine() -> dict:
    """Where the figures come from: another CPU gives other ratios."""
    cpu = platform.processor()
    if osp.isfile('/proc/cpuinfo'):  # the CPU's name as the kernel gives it
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f
                        if line.startswith('model name')), cpu)
    info = dict(platform=platform.platform(), cpu=cpu, python=platform.python_version(),
                torch=torch.__version__, cpus=os.cpu_count(),
                torch_threads=torch.get_num_threads())
    if torch.cuda.is_available():
        info['gpu'] = torch.cuda.get_device_name()
    return info


def git_commit(checkout: str = REPO) -> Optional[str]:
    """The checkout's short commit, with ``+dirty`` when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(['git', '-C', checkout, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        dirty = git('status', '--porcelain', '--untracked-files=no')
        return git('rev-parse', '--short', 'HEAD') + ('+dirty' if dirty else '')
    except (OSError, subprocess.CalledProcessError):
        return None


def run_record(tool: str, argv: Optional[List[str]], load: Optional[float]) -> dict:
    """What every result file starts with: the command that made it (``tool`` relative to
    the repository), the commit, the machine and the load per core before timing."""
    command = ' '.join(['python', tool] + (argv if argv is not None else sys.argv[1:]))
    return dict(command=command, commit=git_commit(), machine=machine(),
                load_per_core_before=load)


def child_json(command: List[str], failure: str, **run_kwargs) -> dict:
    """Run ``command`` as a fresh process and read the JSON object of its last printed line;
    exit with ``failure`` and the end of its errors when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **run_kwargs)
    if done.returncode:
        raise SystemExit(f'{failure}:\n{done.stderr[-3000:]}')
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_json(path: str, results: dict, indent: int = 2) -> None:
    """``results`` into ``path``, its folder made when missing."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(results, f, indent=indent)
