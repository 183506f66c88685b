"""Check on a GPU node what the CPU test suite cannot, in one markdown report: 1. the stack,
2. pytest -m cuda tests/test_cuda.py, 3. our DeiT-S step against DINO's, 4. the data loader
against the step, 5. a short learning run of the evidence recipe with its k-NN probe.

    bash projects/mst_research/tools/check_gpu.sh [--report FILE] [--wheels DIR] [--dino DIR] \
        [--dry-run] ...

The wrapper picks the interpreter ($PYTHON) and puts the repository and mst_research on
PYTHONPATH. Also read: $CHECK_GPU_SCRATCH (data, installed wheels), $CHECK_GPU_EPOCHS (default
6), $CHECK_GPU_ALL_CUDA_TESTS=1 (no deselected train.py --amp run) and $CHECK_GPU_LOADER_TOOL
(a stand-in loader benchmark, for the tests). Exit status: 0 all passed or not available (no
CUDA device), 1 a step failed or ran out of time, 2 bad input.
"""
import argparse
import os
import os.path as osp
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from mst_research.gpu_check import DINO_FILES, GPUCheck, cuda_available, gpu_peak_tflops


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('report_path', nargs='?', metavar='REPORT', help='same as --report')
    parser.add_argument('--report', default='work_dirs/check_gpu/report.md',
                        help="the report; the steps' logs go into check_gpu_logs/ beside it")
    parser.add_argument('--wheels', metavar='DIR', help='install the stack from these wheels '
                        "(tools/collect_device_wheels.sh) on top of the Python's own torch")
    parser.add_argument('--dino', metavar='DIR', default=env('DINO_DIR'),
                        help='a facebookresearch/dino clone (default: $DINO_DIR, else '
                        'work_dirs/dino when it holds one)')
    parser.add_argument('--budget', default=env('CHECK_GPU_BUDGET_S', '520'),
                        help='seconds for the whole check (default: $CHECK_GPU_BUDGET_S, else '
                        '520); each step has its own limit, cut to what is left')
    parser.add_argument('--peak-tflops', default=env('PEAK_TFLOPS'), help="the GPU's dense "
                        'float16 peak for the MFU (default: $PEAK_TFLOPS, else by GPU name)')
    parser.add_argument('--copy-to', metavar='DIR',
                        help='at the end, copy the report and a .tgz of the logs into DIR')
    parser.add_argument('--dry-run', action='store_true',
                        default=env('CHECK_GPU_DRY_RUN') == '1', help="(or CHECK_GPU_DRY_RUN=1) "
                        "every step's CPU part at tiny sizes: it exercises the check; its "
                        'figures mean nothing')
    args = parser.parse_args(argv)
    if not args.budget.isdigit() or int(args.budget) < 60:
        parser.error(f"--budget takes whole seconds, at least 60, not '{args.budget}'")
    if args.peak_tflops and not args.peak_tflops.replace('.', '', 1).isdigit():
        parser.error(f"--peak-tflops takes a number such as 989, not '{args.peak_tflops}'")
    if args.wheels and not any(Path(args.wheels).glob('*.whl')):
        parser.error(f"--wheels '{args.wheels}' holds no wheels: collect them with bash "
                     'tools/collect_device_wheels.sh where pip reaches the package index')
    if args.dino is None and osp.isfile('work_dirs/dino/main_dino.py'):
        args.dino = 'work_dirs/dino'
    for name in DINO_FILES if args.dino else ():
        if not osp.isfile(osp.join(args.dino, name)):
            parser.error(f"--dino '{args.dino}' lacks {name}: copy main_dino.py, utils.py and "
                         'vision_transformer.py of a facebookresearch/dino clone there')
    args.report, args.budget = args.report_path or args.report, int(args.budget)
    args.wheels, args.dino, args.copy_to = (
        path and osp.abspath(path) for path in (args.wheels, args.dino, args.copy_to))
    args.scratch = env('CHECK_GPU_SCRATCH', osp.join(tempfile.gettempdir(), 'mst_mm_check_gpu'))
    args.epochs = int(env('CHECK_GPU_EPOCHS', 6))
    args.all_cuda_tests = env('CHECK_GPU_ALL_CUDA_TESTS') == '1'
    args.loader_tool = env('CHECK_GPU_LOADER_TOOL',
                           'projects/mst_research/tools/benchmark_loader.py')
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if not (args.dry_run or cuda_available()):
        print('check_gpu: torch sees no CUDA device on this machine: nothing to check (the CPU '
              'suite is bash tools/run_tests.sh; --dry-run exercises this check).')
        return 0
    os.makedirs(args.scratch, exist_ok=True)
    args.peak_tflops = float(args.peak_tflops or 0) or (None if args.dry_run
                                                         else gpu_peak_tflops())
    return GPUCheck(args).run()


if __name__ == '__main__':
    sys.exit(main())
