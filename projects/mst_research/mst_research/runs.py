"""Running the evidence run: a store of finished units (a rerun skips them), the rows
(pretraining, random init, supervised, the transfer fine-tunes), the lanes that run units in
side-by-side processes, and the reruns of one row or of a committed run's probes.
"""
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
from typing import Callable, List, Optional, Tuple

import torch
from mmengine.config import Config

from mst_mm.converters import backbone_state, load_model

from . import REPO, recipes, report
from .bench import git_commit
from .data import write_json
from .patch_probe import load_frozen_backbone
from .probes import Probe, teacher_of
from .recipes import TRANSFER_FROM, VARIANTS, pretrain_config, split_indices
from .transfer import finetune


class Store:
    """One JSON file per finished unit under ``OUT/results``: a rerun skips it.

    With ``parts``, a folder to commit, the run goes on from what was committed, on any
    machine: each pretraining or supervised unit that finishes is also written there, as its
    row (``PARTS/results/NAME.json``, with its ``seed``, the ``commit`` whose code ran it and
    its ``backbone``'s path in PARTS) and its teacher backbone (``PARTS/checkpoints/NAME.pth``,
    as ``mst2downstream.py --target mmpretrain`` writes it; the student's for the supervised
    row), and a unit found there is taken as finished."""

    def __init__(self, out: str, parts: Optional[str] = None) -> None:
        self.root = osp.join(out, 'results')
        os.makedirs(self.root, exist_ok=True)
        self.parts = parts
        self.commit = git_commit()   # of the code this process loaded, not of a later edit

    def path(self, name: str) -> str:
        return osp.join(self.root, f'{name}.json')

    def part(self, name: str, kind: str = 'results') -> str:
        return osp.join(self.parts, kind, f"{name}.{'json' if kind == 'results' else 'pth'}")

    def finished(self, name: str) -> bool:
        return osp.isfile(self.path(name)) or bool(self.parts and osp.isfile(self.part(name)))

    def load(self, name: str) -> dict:
        if not osp.isfile(self.path(name)):
            raise SystemExit(f'{self.path(name)} is missing: the unit {name} has not finished. '
                             'Run the evidence command again without --units.')
        with open(self.path(name)) as f:
            return json.load(f)

    def get(self, name: str, compute: Callable[[], dict],
            complete: Optional[Callable[[dict], dict]] = None) -> dict:
        """The stored unit, or ``compute()`` stored; ``complete(value)`` returns the keys
        that a unit stored by older code lacks (e.g. the patch probe), computed from the
        unit's checkpoint and stored beside the others, so a rerun does not pretrain again."""
        if not osp.isfile(self.path(name)) and self.parts and osp.isfile(self.part(name)):
            with open(self.part(name)) as f:
                row = json.load(f)
            write_json(self.path(name), dict(row, backbone=osp.join(self.parts, row['backbone'])))
        if not osp.isfile(self.path(name)):
            return write_json(self.path(name), compute())
        value = self.load(name)
        extra = complete(value) if complete is not None else {}
        return write_json(self.path(name), dict(value, **extra)) if extra else value

    def commit_part(self, name: str, seed: int, row: dict, weights: str = 'teacher') -> dict:
        """With ``parts``: ``row`` and the backbone of its training checkpoint into the
        parts folder (see the class); returns ``row``."""
        if self.parts:
            backbone = self.part(name, 'checkpoints')
            for kind in ('checkpoints', 'results'):
                os.makedirs(osp.join(self.parts, kind), exist_ok=True)
            meta = dict(source=f'{name}/{osp.basename(row["checkpoint"])}', weights=weights,
                        target='mmpretrain')
            torch.save(dict(state_dict=backbone_state(row['checkpoint'], weights), meta=meta),
                       backbone)
            part = {k: v for k, v in row.items() if k != 'checkpoint'}
            write_json(self.part(name), dict(part, seed=seed, commit=self.commit,
                                             backbone=osp.relpath(backbone, self.parts)))
        return row


def pretrained_row(store: Store, probe: Probe, variant: str, seed: int, schedule: dict,
                   data_root: str, out: str, guidance_curve: bool) -> dict:
    """Pretrain one variant and seed, probe its last teacher (and, for the guidance curve,
    the teacher of every epoch)."""
    name = f'{variant}_seed{seed}'
    work_dir = osp.join(out, 'pretrain', name)
    cfg = pretrain_config(schedule['config'], variant, seed, schedule, data_root, work_dir)

    def compute() -> dict:
        checkpoints = recipes.pretrain(cfg)
        row = probe.model(load_model(cfg, checkpoints[-1], seed))
        scalars = report.read_scalars(work_dir, all_runs=True)
        # The last logged loss, teacher entropy and KL.
        row.update((key, r[key]) for r in scalars for key in report.CURVE_KEYS if key in r)
        # The hook logs at epoch ends, by iteration; the loop drops the last partial batch.
        iters_per_epoch = len(split_indices(data_root, schedule)[0]) // \
            cfg.train_dataloader.batch_size
        probe_key = f'knn_probe_top1_k{recipes.KNN_K}'
        row['knn_probe'] = [[r['step'] // iters_per_epoch, r[probe_key]]
                            for r in scalars if probe_key in r]
        row['curves'] = report.epoch_means(scalars)
        if guidance_curve:
            row['guidance_by_epoch'] = [
                dict(epoch=e, **probe.model(load_model(cfg, ckpt, seed), classify=False))
                for e, ckpt in enumerate(checkpoints, 1)]
        row['checkpoint'] = checkpoints[-1]
        return store.commit_part(name, seed, row)

    def complete(row: dict) -> dict:
        """The keys a row stored by older code lacks: the patch probe, the curves."""
        extra = probe.complete(teachers(cfg, seed))(row)
        if 'curves' not in row:
            extra['curves'] = report.epoch_means(report.read_scalars(work_dir, all_runs=True))
        return extra

    return store.get(name, compute, complete)


def teachers(cfg: Config, seed: int) -> Callable[[str], tuple]:
    """For :meth:`Probe.complete`: a checkpoint of the ``cfg`` model -> its teacher."""
    return lambda checkpoint: teacher_of(load_model(cfg, checkpoint, seed))


def random_init_row(store: Store, probe: Probe, seed: int, schedule: dict, data_root: str,
                    out: str) -> dict:
    path = osp.join(out, 'random_init', f'seed{seed}.pth')
    cfg = pretrain_config(schedule['config'], 'mst_guided_mask', seed, dict(schedule, epochs=1),
                          data_root, out, probe=False)

    def compute() -> dict:
        model = load_model(cfg, None, seed)
        os.makedirs(osp.dirname(path), exist_ok=True)
        torch.save({'state_dict': model.state_dict()}, path)
        return dict(probe.model(model), checkpoint=path)

    return store.get(f'random_init_seed{seed}', compute, probe.complete(teachers(cfg, seed)))


def supervised_row(store: Store, probe: Probe, seed: int, schedule: dict, data_root: str,
                   out: str) -> dict:
    """The ceiling: the same ViT trained with labels on the same images and epochs."""
    cfg = pretrain_config(schedule['config'], 'dino', seed, schedule, data_root, out,
                          probe=False)

    def compute() -> dict:
        indices = split_indices(data_root, schedule)[0] if schedule.get('validation') else None
        checkpoint = recipes.train_supervised(
            cfg, osp.join(data_root, 'objects'), osp.join(out, 'supervised', f'seed{seed}'),
            schedule['epochs'], seed, indices, schedule.get('batch_size'))
        return store.commit_part(f'supervised_seed{seed}', seed, dict(
            probe.backbone(*recipes.load_supervised_backbone(checkpoint, cfg)),
            checkpoint=checkpoint), weights='student')

    return store.get(f'supervised_seed{seed}', compute, probe.complete(
        lambda checkpoint: recipes.load_supervised_backbone(checkpoint, cfg)))


def swin_row(store: Store, variant: str, schedule: dict, data_root: str, out: str) -> dict:
    """The MaskSwin-nano pretraining that Mask R-CNN starts from (one seed)."""
    name = f'swin_{variant}_seed0'
    cfg = pretrain_config(recipes.SWIN_CONFIG, variant, 0, schedule, data_root,
                          osp.join(out, 'pretrain', name), probe=False)
    return store.get(name, lambda: dict(checkpoint=recipes.pretrain(cfg)[-1]))


def finetune_row(store: Store, target: str, start: str, ft_seed: int, schedule: dict,
                 data_root: str, out: str, frozen: bool = False) -> dict:
    """Mask R-CNN (MaskSwin-nano, ``mmdet``) or SETR (ViT, ``mmseg``) fine-tuned on the scenes
    from the ``start`` row's checkpoint (Mask R-CNN's random init is mmdet's own); with
    ``frozen``, the backbone stays as initialised and only the neck and heads train."""
    if target == 'mmdet':
        checkpoint = None if start == 'random_init' else store.load(f'swin_{start}_seed0')
    else:
        checkpoint = store.load(f'{start}_seed0')
    if checkpoint and 'checkpoint' not in checkpoint:
        raise SystemExit(f'the {target} fine-tune from {start} needs its pretraining\'s '
                         f'training checkpoint, which the committed part {checkpoint["backbone"]} '
                         'does not hold: run the transfer rows with an --out that holds the '
                         'pretraining, or without --parts.')
    checkpoint = checkpoint and checkpoint['checkpoint']
    config = recipes.DET_CONFIG if target == 'mmdet' else recipes.SEG_CONFIG
    options = (dict(train_cfg=dict(max_iters=20, val_interval=20))
               if schedule['finetune'] == 'quick' else None)
    name = f"{target}{'_frozen' if frozen else ''}_{start}_ft{ft_seed}"
    return store.get(name, lambda: finetune(config, checkpoint, osp.join(out, 'transfer', name),
                                            osp.join(data_root, 'scenes'), ft_seed, target,
                                            options, frozen_backbone=frozen))


def finetune_units(schedule: dict) -> List[Tuple[str, str, str, int, bool]]:
    """(unit name, target, start, fine-tune seed, frozen) of every fine-tune of the schedule."""
    return [(f"{target}{'_frozen' if frozen else ''}_{start}_ft{seed}", target, start, seed,
             frozen) for start in TRANSFER_FROM for target in schedule['transfer_targets']
            for frozen in (False, True) for seed in range(schedule['finetune_seeds'])]


# Rough minutes of each kind of unit on one core, to balance the lanes.
UNIT_MINUTES = dict(random=1, supervised=3, swin=12, mmdet=4, mmseg=3, vit=10)


def plan_units(schedule: dict) -> List[List[str]]:
    """The run's units in stages: the units of a stage are independent of each other, and
    the fine-tunes of the second start from checkpoints of the first."""
    seeds = schedule['seeds']
    first = [f'random_init_seed{s}' for s in range(max(seeds.values()))]
    first += [f'supervised_seed{s}' for s in range(schedule['supervised_seeds'])]
    first += [f'{v}_seed{s}' for v, n in seeds.items() for s in range(n)]
    targets = schedule['transfer_targets']
    if not targets:
        return [first]
    if 'mmdet' in targets:
        first += [f'swin_{v}_seed0' for v in TRANSFER_FROM[1:]]
    return [first, [unit[0] for unit in finetune_units(schedule)]]


def split_lanes(names: List[str], jobs: int) -> List[List[str]]:
    """The longest unit first onto the least loaded lane."""
    def minutes(name: str) -> int:
        return UNIT_MINUTES.get(name.split('_')[0], UNIT_MINUTES['vit'])

    lanes: List[List[str]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for name in sorted(names, key=minutes, reverse=True):
        lane = load.index(min(load))
        lanes[lane].append(name)
        load[lane] += minutes(name)
    return [lane for lane in lanes if lane]


def run_unit(name: str, store: Store, probe: Probe, schedule: dict, data_root: str,
             out: str) -> dict:
    """One unit by its name in :func:`plan_units`."""
    kind, _, rest = name.partition('_')
    if kind in ('mmdet', 'mmseg'):
        frozen = rest.startswith('frozen_')
        start, _, ft_seed = rest.removeprefix('frozen_').rpartition('_ft')
        return finetune_row(store, kind, start, int(ft_seed), schedule, data_root, out,
                            frozen)
    row, _, seed = name.rpartition('_seed')
    if kind == 'swin':
        return swin_row(store, rest.rpartition('_seed')[0], schedule, data_root, out)
    if row in ('random_init', 'supervised'):
        unit = random_init_row if row == 'random_init' else supervised_row
        return unit(store, probe, int(seed), schedule, data_root, out)
    return pretrained_row(store, probe, row, int(seed), schedule, data_root, out,
                          guidance_curve=seed == '0')


def run_lanes(stages: List[List[str]], jobs: int, command: List[str], store: Store,
              out: str) -> None:
    """Each stage's unfinished units in ``jobs`` processes side by side, each ``command``
    (the evidence tool and its arguments) with ``--jobs 1 --units ...``; their logs go to
    ``OUT/lanes/``. Every unit seeds itself, so the numbers do not depend on ``jobs``."""
    os.makedirs(osp.join(out, 'lanes'), exist_ok=True)
    for index, names in enumerate(stages, 1):
        pending = [n for n in names if not store.finished(n)]
        lanes = []
        for lane, units in enumerate(split_lanes(pending, jobs)):
            log = osp.join(out, 'lanes', f'stage{index}_lane{lane}.log')
            print(f'stage {index}, lane {lane}: {len(units)} unit(s), log {log}', flush=True)
            with open(log, 'a') as f:
                lanes.append((subprocess.Popen(
                    [sys.executable, *command, '--jobs', '1',
                     '--units', ','.join(units)], stdout=f, stderr=subprocess.STDOUT), log))
        failed = [log for process, log in lanes if process.wait() != 0]
        if failed:
            raise SystemExit(f"a lane failed; the end of {', '.join(failed)} says why. "
                             'Finished units are kept: run the same command again to go on.')


def from_checkpoints(run_dir: str, probe: Probe, schedule: dict, data_root: str,
                     out: str) -> dict:
    """A finished run's probes, guidance shares and evidence picture, recomputed from the
    teacher backbones it committed (``RUN_DIR/checkpoints/ROW_seedS.pth``, ROW a variant or
    ``supervised``, seeds 0, 1, ... of a row) and its random-init seeds (rebuilt from the
    seed), in place of the committed values of ``RUN_DIR/summary.json``, into
    ``OUT/summary.json``; what comes from training (curves, per-epoch guidance, transfer) is
    kept. Prints each value that differs from the committed one at its printed digit."""
    summary_path = osp.join(run_dir, 'summary.json')
    files = sorted(glob.glob(osp.join(run_dir, 'checkpoints', '*_seed*.pth')))
    if not osp.isfile(summary_path) or not files:
        raise SystemExit(f'--from-checkpoints {run_dir} needs summary.json and '
                         'checkpoints/ROW_seedS.pth in it (e.g. docs/results/evidence_50e).')
    with open(summary_path) as f:
        committed = json.load(f)
    cfg = Config.fromfile(schedule['config'])
    pre = cfg.model.data_preprocessor
    store = Store(out)
    results = dict(raw_pixels=[store.get('raw_pixels', probe.raw_pixels, probe.complete(None))],
                   random_init=[random_init_row(store, probe, s, schedule, data_root, out)
                                for s in range(len(committed['knn_top1']['random_init']))])
    for path in files:
        row, _, seed = osp.basename(path)[:-len('.pth')].rpartition('_seed')
        if row not in (*VARIANTS, 'supervised') or seed != str(len(results.get(row, []))):
            raise SystemExit(f'{path}: expected ROW_seedS.pth with ROW one of '
                             f"{', '.join((*VARIANTS, 'supervised'))} and the seeds of a row "
                             'from 0 without gaps.')
        results.setdefault(row, []).append(store.get(
            f'{row}_seed{seed}', lambda path=path: dict(probe.backbone(
                load_frozen_backbone(cfg.model.backbone, path), pre.mean, pre.std),
                checkpoint=path)))
    summary, differences = report.recomputed_summary(committed, results)
    table = report.write_summary(summary, {v: len(summary['knn_top1'][v]) for v in VARIANTS
                                    if v in summary['knn_top1']}, out, store.commit)
    pictures = []
    if results.get('mst_guided_mask'):   # the teacher's attention and masks, no decoder
        model = report.guided_model(schedule, data_root, out,
                                    backbone=results['mst_guided_mask'][0]['checkpoint'])
        os.makedirs(osp.join(out, 'pictures'), exist_ok=True)
        pictures.append(report.evidence_figure(model, summary, report.class_examples(data_root),
                                        osp.join(out, 'pictures', 'evidence.png'),
                                        reconstruct=False))
    print('\n' + table)
    print(f'\nrecomputed from {len(files)} checkpoint(s) of {run_dir}, the raw pixels and '
          f"{len(results['random_init'])} random-init seed(s): {osp.join(out, 'summary.json')}; "
          f"pictures: {', '.join(pictures) or 'none (no mst_guided_mask checkpoint)'}")
    print('\n'.join(differences) if differences else
          'every recomputed value equals the committed one to its printed digit')
    return summary


def rerun_row(only: str, probe: Probe, schedule: dict, data_root: str, out: str,
              parts: Optional[str] = None) -> dict:
    variant, _, seed = only.partition(':')
    if variant not in VARIANTS or not seed.isdigit():
        raise SystemExit(f"--only takes VARIANT:SEED with VARIANT one of {', '.join(VARIANTS)}, "
                         f'e.g. mst_guided_mask:1; got {only!r}.')
    rerun_dir = osp.join(out, 'rerun')
    row = pretrained_row(Store(rerun_dir, parts), probe, variant, int(seed), schedule, data_root,
                         rerun_dir, guidance_curve=False)
    print(f'{variant}, seed {seed}: k-NN {row["knn_top1"]:.1f}, linear {row["linear_top1"]:.1f}, '
          f'last loss_dino {row["loss_dino"]:.3f}, attention on object '
          f'{row["attention_on_object_share"]:.3f}, candidates on object '
          f'{row["candidates_on_object_share"]:.3f}')
    summary_path = osp.join(out, 'summary.json')
    if osp.isfile(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        print(f"the full run's {variant} row: k-NN "
              f"{report.mean_std(summary['knn_top1'][variant])}, "
              f"linear {report.mean_std(summary['linear_top1'][variant])}")
    return row


def run_all(store: Store, probe: Probe, schedule: dict, data_root: str, out: str) -> dict:
    """Every unit of the schedule (each stored one read back), then ``OUT/summary.json``,
    ``OUT/evidence_table.md`` and the pictures; prints the table."""
    raw = store.get('raw_pixels', probe.raw_pixels, probe.complete(None))
    units = {name: run_unit(name, store, probe, schedule, data_root, out)
             for stage in plan_units(schedule) for name in stage}
    rows = {v: [units[f'{v}_seed{s}'] for s in range(n)] for v, n in schedule['seeds'].items()}
    transfer = None
    if schedule['transfer_targets']:   # target[_frozen] -> start -> metric -> seeds' values
        transfer = {f'{target}{suffix}': {} for suffix in ('', '_frozen')
                    for target in schedule['transfer_targets']}
        for name, target, start, _, frozen in finetune_units(schedule):
            metrics = transfer[target + ('_frozen' if frozen else '')].setdefault(start, {})
            for key, value in units[name].items():
                metrics.setdefault(key, []).append(value)
    image_views = schedule['epochs'] * len(split_indices(data_root, schedule)[0])
    summary = report.make_summary(
        Config.fromfile(schedule['config']).model.head.out_channels, image_views, raw,
        [units[f'random_init_seed{s}'] for s in range(max(schedule['seeds'].values()))],
        [units[f'supervised_seed{s}'] for s in range(schedule['supervised_seeds'])], rows,
        transfer)
    table = report.write_summary(summary, schedule['seeds'], out, store.commit)
    pictures = report.write_pictures(rows, summary, schedule, out, data_root)
    if store.parts:   # the folder to commit: the summary and the README's two pictures
        report.write_summary(summary, schedule['seeds'], store.parts, store.commit)
        for picture in ('pretraining_curves.png', 'evidence.png'):
            shutil.copyfile(osp.join(out, 'pictures', picture), osp.join(store.parts, picture))
    print('\n' + table)
    print(f"\nschedule: {schedule['epochs']} epochs of {image_views // schedule['epochs']:,} "
          f"images ({image_views:,} image-views per run), "
          f"{osp.relpath(schedule['config'], REPO)}; the committed runs' tables: "
          'docs/evidence.md')
    print(f"summary: {osp.join(out, 'summary.json')}\npictures: {', '.join(pictures)}")
    return summary
