"""What MST costs over DINO, and how our training step compares with the original DINO code.

    python projects/mst_research/tools/benchmark.py [--models tiny deit-s swin-t CONFIG.py ...]
    python projects/mst_research/tools/benchmark.py --models deit-s --prototype-precision bfloat16
    python projects/mst_research/tools/benchmark.py --reference-dino /path/to/dino [--dtypes ...]

Per model: (a) the MST step against DINO mode's and MST's with the mask only, (b) the
teacher's forward with and without its CLS attention, (c) the decoder's share of the step
(``mst_research.step_cost``); or the prototype layer in float32 against autocast; or DINO's
own ``main_dino.py`` step against our DINO mode and MST (``mst_research.dino_reference``).
The steps take turns in every repetition (``mst_research.bench``); a ratio is that of the
medians, with the range of the ratios inside each repetition. docs/benchmarks.md explains
every figure.
"""
import argparse
import logging
from typing import List, Optional

import torch
from mmengine.logging import MMLogger

from mst_research import bench, dino_reference, step_cost


def build_parser() -> argparse.ArgumentParser:
    """The command line of this tool; every option has a help text."""
    parser = argparse.ArgumentParser(
        description='MST vs DINO cost benchmark, and our step against the original DINO code',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--models', nargs='+', default=None, metavar='MODEL_OR_CONFIG',
                        help=f'built-in models ({", ".join(step_cost.MODELS)}) or paths to '
                        'pretraining configs; default: every built-in, or deit-s with '
                        '--reference-dino')
    parser.add_argument('--repeats', type=int, default=5,
                        help='timed repetitions of every variant (the median is reported)')
    parser.add_argument('--warmup', type=int, default=2, help='untimed steps per variant')
    parser.add_argument('--batch-size', type=int, default=None,
                        help='images per step of every model; default: '
                        + ', '.join(f'{k} {v}' for k, (_, v) in step_cost.MODELS.items())
                        + f', a config path {step_cost.DEFAULT_BATCH_SIZE}')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='where the steps run: cpu or cuda')
    parser.add_argument('--threads', type=int, default=None,
                        help="torch CPU threads (torch.set_num_threads); default: torch's own")
    parser.add_argument('--reference-dino', metavar='DIR',
                        help='a clone of facebookresearch/dino: time its main_dino.py step '
                        'against our DINO mode and MST instead of (a)-(c)')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help="mixed precision on both sides of --reference-dino (DINO's "
                        'autocast + GradScaler, our AMP optimiser wrapper); default: on '
                        'with CUDA, off on the CPU')
    parser.add_argument('--dtypes', nargs='+', choices=('float16', 'bfloat16'), default=None,
                        help='with --reference-dino and AMP: the autocast dtype of our steps; '
                        'several are timed side by side as steps named dino_mode_DTYPE and '
                        "mst_DTYPE (DINO's step keeps its float16); default: our AMP "
                        "optimiser wrapper's own (float16 on CUDA), steps dino_mode and mst")
    parser.add_argument('--prototype-precision', choices=('float16', 'bfloat16'), default=None,
                        help='instead of (a)-(c): the MST step under autocast in this dtype '
                        "with the DINO neck's prototype layer in float32 against the same "
                        'step with the layer left to autocast (on the CPU, bfloat16 only)')
    parser.add_argument('--peak-tflops', type=float, default=None,
                        help="with --reference-dino: the device's dense peak in TFLOP/s for "
                        'the precision used (e.g. 989 for an H100 in bf16), to report the '
                        'model FLOP utilisation of each step')
    parser.add_argument('--out', default='work_dirs/benchmark/benchmark.json',
                        help='the JSON file that receives every figure')
    return parser


def main(argv: Optional[List[str]] = None) -> dict:
    """Time what the options ask for, print it and write it to ``--out``; returns it."""
    args = build_parser().parse_args(argv)
    configs = {name: step_cost.resolve_model(name)  # refuse a bad name first
               for name in args.models or (['deit-s'] if args.reference_dino
                                           else list(step_cost.MODELS))}
    amp = args.device.startswith('cuda') if args.amp is None else args.amp
    if amp and not args.device.startswith('cuda'):
        raise ValueError("--amp needs --device cuda: DINO's mixed precision is CUDA-only.")
    if args.prototype_precision and args.reference_dino:
        raise ValueError('--prototype-precision and --reference-dino are two different runs.')
    if args.prototype_precision == 'float16' and not args.device.startswith('cuda'):
        raise ValueError("--prototype-precision float16 needs --device cuda: the CPU's "
                         'autocast is bfloat16.')
    if args.dtypes and not (amp and args.reference_dino):
        raise ValueError('--dtypes sets the autocast dtype of our steps against '
                         '--reference-dino: it needs --reference-dino and AMP (--amp, the '
                         'default on CUDA).')
    if args.threads:
        torch.set_num_threads(args.threads)
    load = bench.load_per_core()  # before the first timing: what else the machine was doing
    print('1-minute load average per core before timing: '
          + ('unknown' if load is None else f'{load:.2f}'), flush=True)
    results = dict(bench.run_record('projects/mst_research/tools/benchmark.py', argv, load),
                   device=args.device, repeats=args.repeats, peak_tflops=args.peak_tflops,
                   models={})
    logger = MMLogger.get_current_instance()
    previous_level = logger.level
    logger.setLevel(logging.WARNING)  # no per-parameter lines
    try:
        for name, (config, default_batch_size) in configs.items():
            batch_size = args.batch_size or default_batch_size
            print(f'[{name}] timing ...', flush=True)
            if args.reference_dino:
                results['models'][name] = dino_reference.compare_with_reference(
                    config, args.reference_dino, batch_size, args.repeats, args.warmup,
                    args.device, amp, args.dtypes)
            elif args.prototype_precision:
                results['models'][name] = step_cost.measure_prototype_precision(
                    config, batch_size, args.repeats, args.warmup, args.device,
                    args.prototype_precision)
            else:
                results['models'][name] = step_cost.measure_steps(
                    step_cost.load_variants(config), batch_size, args.repeats, args.warmup,
                    args.device)
    finally:  # the tool also runs in-process (tests): leave the shared logger as it was
        logger.setLevel(previous_level)
    (dino_reference.print_reference_table if args.reference_dino
     else step_cost.print_prototype_precision_table if args.prototype_precision
     else step_cost.print_cost_table)(results)
    bench.write_json(args.out, results)
    print(f'\nwritten to {args.out}')
    return results


if __name__ == '__main__':
    main()
