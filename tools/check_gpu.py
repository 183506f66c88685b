"""Check on a GPU node what the CPU test suite cannot: the stack, the CUDA tests, our step
against DINO's, the data loader and a short learning run, in one markdown report
(``mst_research.gpu_check`` says what each step does). Run it through its wrapper, which
picks the interpreter and puts the repository on PYTHONPATH:

    bash tools/check_gpu.sh [--report FILE] [--dino DIR] [--budget SECONDS]
    bash tools/check_gpu.sh --wheels DIR      # an air-gapped node: install these wheels first
    bash tools/check_gpu.sh --dry-run         # every step's CPU part at tiny sizes, no GPU

Exit status: 0 every step passed or was not available, 1 a step failed or ran out of time,
2 bad input. On a machine where torch sees no CUDA device (and no --dry-run) it says so and
exits 0.
"""
import argparse
import glob
import os
import os.path as osp
import subprocess
import sys
import tempfile
from typing import List, Optional

from mst_research.gpu_check import DINO_FILES, GPUCheck, gpu_peak_tflops


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--report', default='work_dirs/check_gpu/report.md',
                        help="the report; every step's log goes into its folder")
    parser.add_argument('report_path', nargs='?', metavar='REPORT',
                        help='the same as --report (the form of earlier versions)')
    parser.add_argument('--wheels', metavar='DIR', help='install the stack from these wheels '
                        'first (tools/collect_device_wheels.sh), into a folder on PYTHONPATH, '
                        "so that the node's own torch and numpy are used")
    parser.add_argument('--dino', metavar='DIR', default=env('DINO_DIR'),
                        help="a facebookresearch/dino clone for step 3 (default: $DINO_DIR, "
                        'else work_dirs/dino when it holds one)')
    parser.add_argument('--budget', default=env('CHECK_GPU_BUDGET_S', '520'),
                        help='seconds for the whole check (default 520); every step has its '
                        'own limit, cut to what is left')
    parser.add_argument('--peak-tflops', default=env('PEAK_TFLOPS'),
                        help="the GPU's dense float16/bfloat16 peak for the MFU (default: "
                        '989 for an H100 SXM or H200, 756 for an H100 PCIe)')
    parser.add_argument('--copy-to', metavar='DIR',
                        help='at the end, copy the report and a .tgz of the logs there')
    parser.add_argument('--dry-run', action='store_true',
                        default=env('CHECK_GPU_DRY_RUN', '0') == '1',
                        help="every step's CPU part at tiny sizes, without CUDA: exercises "
                        'the check; its figures mean nothing')
    parser.add_argument('--all-cuda-tests', action='store_true',
                        default=env('CHECK_GPU_ALL_CUDA_TESTS', '0') == '1',
                        help='keep the train.py --amp runs that the budget leaves out')
    args = parser.parse_args(argv)
    args.report = args.report_path or args.report
    if not args.budget.isdigit() or int(args.budget) < 60:
        parser.error(f"--budget takes whole seconds, at least 60, not '{args.budget}'")
    try:
        args.peak_tflops = args.peak_tflops and float(args.peak_tflops)
    except ValueError:
        parser.error(f"--peak-tflops takes a number of TFLOP/s such as 989, not "
                     f"'{args.peak_tflops}'")
    if args.wheels and not glob.glob(osp.join(args.wheels, '*.whl')):
        parser.error(f"--wheels '{args.wheels}' holds no wheels: collect them with bash "
                     'tools/collect_device_wheels.sh where pip reaches the index')
    if args.dino is None and osp.isfile('work_dirs/dino/main_dino.py'):
        args.dino = 'work_dirs/dino'
    missing = [f for f in DINO_FILES if args.dino and not osp.isfile(osp.join(args.dino, f))]
    if missing:
        parser.error(f"--dino '{args.dino}' lacks {missing[0]}: copy main_dino.py, utils.py "
                     'and vision_transformer.py of a facebookresearch/dino clone there')
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    cuda = subprocess.run([sys.executable, '-c', 'import sys, torch; '
                           'sys.exit(not torch.cuda.is_available())']).returncode == 0
    if not (cuda or args.dry_run):
        print('check_gpu: torch sees no CUDA device on this machine: nothing to check (the CPU '
              'suite is bash tools/run_tests.sh; --dry-run exercises this check).')
        return 0
    os.makedirs(osp.dirname(osp.abspath(args.report)), exist_ok=True)
    scratch = os.environ.get('CHECK_GPU_SCRATCH') or osp.join(tempfile.gettempdir(),
                                                              'mst_mm_check_gpu')
    wheels, dino, copy_to = (path and osp.abspath(path)
                             for path in (args.wheels, args.dino, args.copy_to))
    return GPUCheck(args.report, int(args.budget), args.dry_run,
                    args.peak_tflops or (None if args.dry_run else gpu_peak_tflops()),
                    wheels, dino, scratch, copy_to, args.all_cuda_tests,
                    os.environ.get('CHECK_GPU_LOADER_TOOL'),
                    int(os.environ.get('CHECK_GPU_EPOCHS', 6))).run()


if __name__ == '__main__':
    sys.exit(main())
