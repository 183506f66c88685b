"""What the 224-px pretraining input costs: a data worker's CPU time per image against DINO's
reference pipeline, the batched device-side part, and the loader's images/s with N workers.

    python projects/mst_research/tools/benchmark_loader.py --reference-dino /path/to/dino
    # a GPU node
    python projects/mst_research/tools/benchmark_loader.py --workers 8 15 --batch-size 128

``mst_research.loader_speed`` says what is timed, docs/benchmarks.md what every figure means.
"""
import argparse
import os
from typing import List, Optional

import cv2
import torch
from mmengine.config import Config

from mst_research import bench, loader_speed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--config', default=loader_speed.CONFIG, help='the pretraining config '
                        'whose train pipeline and data preprocessor are timed')
    parser.add_argument('--reference-dino', metavar='DIR',
                        help='a facebookresearch/dino clone: time DataAugmentationDINO too')
    parser.add_argument('--images', type=int, default=48,
                        help='JPEGs per repetition of the per-image timings')
    parser.add_argument('--repeats', type=int, default=7, help='timed repetitions')
    parser.add_argument('--workers', type=int, nargs='*', default=[],
                        help='time a DataLoader with each number of workers (images/s)')
    parser.add_argument('--batch-size', type=int, default=128,
                        help='images per batch of the DataLoader and the device-side part')
    parser.add_argument('--batches', type=int, default=10,
                        help='timed DataLoader batches per number of workers (after one)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help="where the device-side part runs")
    parser.add_argument('--photos', default='work_dirs/benchmark_loader/photos',
                        help='folder of the JPEGs (written once)')
    parser.add_argument('--out', default='work_dirs/benchmark_loader/loader.json',
                        help='JSON file of every figure')
    return parser


def main(argv: Optional[List[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    os.chdir(bench.REPO)
    cfg = Config.fromfile(args.config)
    needed = max(args.images, args.batch_size * (args.batches + 1) if args.workers else 0)
    paths = loader_speed.write_photos(args.photos, needed)
    results = dict(bench.run_record('projects/mst_research/tools/benchmark_loader.py', argv,
                                    bench.load_per_core()), photo_size=loader_speed.PHOTO_SIZE)
    torch.set_num_threads(1)  # as in a DataLoader worker
    cv2.setNumThreads(0)      # as mmengine's env_cfg sets in workers (opencv_num_threads=0)
    fns = loader_speed.worker_pipelines(cfg, args.reference_dino)
    results['per_image'] = loader_speed.per_image_cpu_ms(fns, paths[:args.images], args.repeats)
    results['device_side'] = loader_speed.device_side_ms(
        cfg, fns['ours'], paths[:args.images], args.batch_size, args.device, args.repeats)
    torch.set_num_threads(os.cpu_count() or 1)
    results['loader'] = [loader_speed.loader_images_per_second(
        cfg, args.photos, n, args.batch_size, args.batches) for n in args.workers]
    loader_speed.print_tables(results)
    bench.write_json(args.out, results, indent=1)
    print(f'\nwritten: {args.out}')
    return results


if __name__ == '__main__':
    main()
