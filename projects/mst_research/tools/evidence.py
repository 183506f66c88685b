"""The evidence run: does MST learn object features, does its mask avoid the object, and do
its checkpoints transfer? On real animal silhouettes, on a CPU
(projects/mst_research/tools/run_evidence.sh).

It writes the object images and scenes once (``mst_research.data``); pretrains the tiny ViT
of ``configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py`` as the rows of the paper's
Table 4 (``mst_research.recipes``); probes the EMA teachers against raw pixels, random init
and the supervised ceiling, and measures where their attention and the guided mask fall
(``mst_research.probes``); fine-tunes Mask R-CNN and SETR on the scenes
(``mst_research.transfer``); and writes ``OUT/summary.json``, ``OUT/evidence_table.md`` and
``OUT/pictures`` (``mst_research.report``). Every finished unit is stored under
``OUT/results`` and skipped by a rerun, and a cut pretraining resumes (``mst_research.runs``).
docs/evidence.md says what the runs show.

    python projects/mst_research/tools/evidence.py [--quick] [--out work_dirs/evidence]
    # one row: pretraining, probes, guidance
    python projects/mst_research/tools/evidence.py --only mst_guided_mask:1
    # a recipe candidate
    python projects/mst_research/tools/evidence.py --validation --only dino:10 --cfg-options ...
    # the long run in parts, each finished unit committed (docs/evidence.md)
    python projects/mst_research/tools/evidence.py --config CONFIG --skip-transfer \
        --parts docs/results/evidence_50e --out work_dirs/evidence_50e
    # the committed run's probes again, from its teacher backbones, without pretraining
    python projects/mst_research/tools/evidence.py --config CONFIG \
        --from-checkpoints docs/results/evidence_50e
"""
import argparse
import os
import os.path as osp
import sys
from typing import Optional, Sequence

import torch
from mmengine.config import Config, DictAction

from mst_research import REPO, recipes, runs
from mst_research.probes import Probe
from mst_research.recipes import TRANSFER_FROM, TRANSFER_TARGETS, VARIANTS, VIT_CONFIG


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true',
                        help='one seed, one short pretraining epoch, short fine-tunes '
                        '(minutes); the same keys as the full run')
    parser.add_argument('--out', default=None,
                        help='output folder (default: work_dirs/evidence, or '
                        'work_dirs/evidence_quick with --quick)')
    parser.add_argument('--data-root', default=None,
                        help='a folder with objects/ and scenes/ as '
                        'projects/mst_research/tools/write_animal_shapes.py writes them (default: '
                        f'{recipes.DEFAULT_DATA_ROOT}, written on the first run)')
    parser.add_argument('--only', metavar='VARIANT:SEED',
                        help='rerun one row (pretraining, k-NN, linear probe, guidance) into '
                        'OUT/rerun and print it beside the full run\'s spread; variants: '
                        + ', '.join(VARIANTS))
    parser.add_argument('--variants', default=','.join(VARIANTS),
                        help='comma-separated variants to pretrain (default: all four)')
    parser.add_argument('--seeds', type=int, default=None,
                        help='seeds of every variant and of the supervised row (default: the '
                        'schedule\'s, 3 for dino and mst_guided_mask, 2 for the others)')
    parser.add_argument('--supervised-seeds', type=int, default=None,
                        help='seeds of the supervised row (default: --seeds, else the '
                        'schedule\'s 2; 0 leaves the row out)')
    parser.add_argument('--epochs', type=int, default=None,
                        help='pretraining epochs of every run (default: 6, the config\'s; '
                        '1 with --quick); the schedule is scaled to them')
    parser.add_argument('--skip-transfer', action='store_true',
                        help='leave out the Mask R-CNN and SETR fine-tunes')
    parser.add_argument('--transfer-targets', default=','.join(TRANSFER_TARGETS),
                        help='the fine-tunes to run, of mmdet (Mask R-CNN, from MaskSwin '
                        'pretrainings of their own) and mmseg (SETR, from the ViT '
                        'checkpoints) (default: both)')
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads of the training process (default: 1; on 2 cores '
                        'the data workers use the other, and 2 threads thrash when anything '
                        'else runs beside)')
    parser.add_argument('--batch-size', type=int, default=None,
                        help='pretraining batch size (default: the config\'s, 64)')
    parser.add_argument('--jobs', type=int, default=min(2, os.cpu_count() or 1),
                        help='units run side by side, each in its own process with --threads '
                        'threads (default: 2 on two or more cores, where the full run takes '
                        'about 2 h; 1 runs everything in this process)')
    parser.add_argument('--config', default=VIT_CONFIG,
                        help='the ViT pretraining config of every row (default: '
                        f'{osp.relpath(VIT_CONFIG, REPO)})')
    parser.add_argument('--validation', action='store_true',
                        help='for choosing a recipe: pretrain without the 1,000 validation '
                        'images carved from the training images (100 per class), and probe '
                        'on them against the other 7,000; the test images are not read')
    parser.add_argument('--probe-interval', type=int, default=None,
                        help='epochs between the k-NN probe hook\'s evaluations (default: '
                        'the config\'s)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='recipe options merged into the ViT pretraining config of every '
                        'row, e.g. custom_hooks.0.start=0.04 (key=value, as tools/train.py)')
    parser.add_argument('--from-checkpoints', metavar='RUN_DIR',
                        help='recompute the probes, guidance shares and evidence picture of a '
                        'finished run, e.g. docs/results/evidence_50e (with its --config), '
                        'from its teacher backbones, RUN_DIR/checkpoints/ROW_seedS.pth, '
                        'without pretraining, into OUT/summary.json; says whether each value '
                        'equals the committed one')
    parser.add_argument('--parts', metavar='DIR',
                        help='a folder to commit, so that a long run goes on in parts on any '
                        'machine: every finished pretraining (and supervised) unit also writes '
                        'its row to DIR/results and its teacher backbone to DIR/checkpoints, a '
                        'unit found there is not run again, and the full run writes its '
                        'summary and the README\'s two pictures there too')
    # A lane's process: these units only, then exit (used by --jobs).
    parser.add_argument('--units', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(',') if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(VARIANTS)}")
    targets = [t for t in args.transfer_targets.split(',') if t]
    if not targets or set(targets) - set(TRANSFER_TARGETS):
        parser.error(f'--transfer-targets takes {" and/or ".join(TRANSFER_TARGETS)}, comma '
                     f'separated, not {args.transfer_targets!r}; to run no fine-tune, give '
                     '--skip-transfer')
    args.transfer_targets = () if args.skip_transfer else tuple(
        t for t in TRANSFER_TARGETS if t in targets)
    if args.transfer_targets and not set(TRANSFER_FROM[1:]) <= set(args.variants):
        parser.error('the transfer rows start from dino and mst_guided_mask: keep both in '
                     '--variants, or add --skip-transfer')
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    schedule = recipes.make_schedule(args)
    out = args.out or ('work_dirs/evidence_quick' if args.quick else 'work_dirs/evidence')
    data_root = recipes.prepare_data(
        args.data_root, transfer=bool(args.transfer_targets) and not args.from_checkpoints)
    probe = Probe(data_root, validation=args.validation,
                  patch_size=Config.fromfile(schedule['config']).model.backbone.patch_size)
    if args.only:
        return runs.rerun_row(args.only, probe, schedule, data_root, out, args.parts)
    if args.from_checkpoints:
        return runs.from_checkpoints(args.from_checkpoints, probe, schedule, data_root, out)
    store = runs.Store(out, args.parts)
    if args.units:
        for name in args.units.split(','):
            runs.run_unit(name, store, probe, schedule, data_root, out)
        return {}
    if args.jobs > 1:
        argv = sys.argv[1:] if argv is None else list(argv)
        runs.run_lanes(runs.plan_units(schedule), args.jobs, [osp.abspath(__file__), *argv],
                       store, out)
    return runs.run_all(store, probe, schedule, data_root, out)


if __name__ == '__main__':
    main()
