"""The evidence run: does MST learn object features, does its mask avoid the object, and do
its checkpoints transfer? On real animal silhouettes, on a CPU (tools/run_evidence.sh).

1. Writes the data once (``mst_mm/evidence/animal_shapes.py``): 8,000 / 2,000 object images
   (32 x 32, one animal) and detection / segmentation scenes (64 x 64, 1-4 animals).
2. Pretrains the tiny ViT of ``configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py`` as
   the paper's Table 4 at CPU scale: the DINO baseline, MST's decoder alone, the decoder
   with a random mask hiding the same expected share of patches as the guided one
   (p / num), and the decoder with the attention-guided mask (num = 8, p = 0.1). A k-NN
   probe hook logs the held-out top-1 during pretraining.
3. Probes the EMA teachers' CLS features (weighted k-NN, k = 20, T = 0.07, and a linear
   probe) and their patch tokens (a frozen linear patch probe, mIoU) against raw pixels,
   randomly initialised backbones and the same ViT trained with labels (the supervised
   ceiling), and measures where the teachers' CLS attention and the guided mask fall against
   the objects' pixel masks, at every epoch of seed 0.
4. Fine-tunes Mask R-CNN (a small MaskSwin pretrained as DINO and as MST on the objects)
   and SETR-naive (the ViTs) on the scenes, from random init, DINO and MST, with the
   backbone trained and with it frozen (only the neck and heads train).
5. Writes ``OUT/summary.json``, ``OUT/evidence_table.md`` and pictures to ``OUT/pictures``.

Every finished unit is stored under ``OUT/results`` and skipped by a rerun, and a
pretraining cut short resumes from its last epoch, so the command goes on where it stopped.

    python tools/evidence.py [--quick] [--out work_dirs/evidence]
    python tools/evidence.py --only mst_guided_mask:1     # one row: pretraining, probes, guidance
    python tools/evidence.py --validation --only dino:10 --cfg-options ...   # a recipe candidate
    python tools/evidence.py --config CONFIG --from-checkpoints docs/results/evidence_50e
        # the committed run's probes again, from its teacher backbones, without pretraining

``--validation`` is for choosing recipes: it trains without 1,000 images carved from the
training images and probes on them, never reading the test images (docs/evidence.md).
"""
import argparse
import copy
import glob
import json
import math
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.config import Config, DictAction

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from mst_mm.models import DINO_MODE  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
VIT_CONFIG = osp.join(REPO, 'configs', 'mst', 'mst_vit-tiny-p4_1xb64-coslr-6e_animals.py')
SWIN_CONFIG = osp.join(REPO, 'configs', 'mst', 'mst_swin-nano-p4-w4_1xb64-coslr-6e_animals.py')
DET_CONFIG = osp.join(REPO, 'configs', 'benchmarks', 'mmdetection',
                      'mask-rcnn_mst-swin-nano_fpn_animal-scenes.py')
SEG_CONFIG = osp.join(REPO, 'configs', 'benchmarks', 'mmsegmentation',
                      'setr_mst-vit-tiny_naive_animal-scenes.py')
NUM, P = 8, 0.1
# name: model overrides of the pretraining config (the paper's Table 4 rows).
VARIANTS = {
    'dino': DINO_MODE,
    'mst_decoder': dict(mask_cfg=dict(mode='none')),
    # The same expected share of masked patches as the guided rule: p / num.
    'mst_random_mask': dict(mask_cfg=dict(mode='random', p=P / NUM)),
    'mst_guided_mask': dict(mask_cfg=dict(mode='attention', num=NUM, p=P)),
}
TRANSFER_FROM = ('random_init', 'dino', 'mst_guided_mask')
TRANSFER_TARGETS = ('mmdet', 'mmseg')
DEFAULT_DATA_ROOT = 'data/animal_shapes'
KNN_K = 20
SCHEDULES = {
    # seeds per variant, pretraining epochs (None: the config's), supervised seeds,
    # fine-tune seeds, fine-tune overrides
    'full': dict(seeds=dict(dino=3, mst_decoder=2, mst_random_mask=2, mst_guided_mask=3),
                 epochs=None, supervised_seeds=2, finetune_seeds=2, finetune=None),
    'quick': dict(seeds=dict(dino=1, mst_decoder=1, mst_random_mask=1, mst_guided_mask=1),
                  epochs=1, supervised_seeds=1, finetune_seeds=1, finetune='quick'),
}


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
                        'tools/misc/write_animal_shapes.py writes them (default: '
                        f'{DEFAULT_DATA_ROOT}, written on the first run)')
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
                        help='recompute the probes (k-NN, linear, patch), guidance shares and '
                        'the evidence picture of a finished run from its teacher backbones, '
                        'RUN_DIR/checkpoints/ROW_seedS.pth (mst2downstream.py --target '
                        'mmpretrain), without pretraining; writes OUT/summary.json, RUN_DIR\'s '
                        'summary with the recomputed values, and says whether each equals '
                        'the committed one, e.g. docs/results/evidence_50e with --config '
                        'configs/mst/mst_vit-tiny-p4_1xb64-coslr-50e_animals.py')
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


# ----------------------------------------------------------------------------- units
class Store:
    """One JSON file per finished unit under ``OUT/results``: a rerun skips it."""

    def __init__(self, out: str) -> None:
        self.root = osp.join(out, 'results')
        os.makedirs(self.root, exist_ok=True)

    def path(self, name: str) -> str:
        return osp.join(self.root, f'{name}.json')

    def load(self, name: str):
        if not osp.isfile(self.path(name)):
            raise SystemExit(f'{self.path(name)} is missing: the unit {name} has not finished. '
                             'Run the evidence command again without --units.')
        with open(self.path(name)) as f:
            return json.load(f)

    def get(self, name: str, compute, complete=None):
        """The stored unit, or ``compute()`` stored; ``complete(value)`` returns the keys
        that a unit stored by older code lacks (e.g. the patch probe), computed from the
        unit's checkpoint and stored beside the others, so a rerun does not pretrain again."""
        if not osp.isfile(self.path(name)):
            return self._write(name, compute())
        value = self.load(name)
        extra = complete(value) if complete is not None else {}
        return self._write(name, dict(value, **extra)) if extra else value

    def _write(self, name: str, value: dict) -> dict:
        with open(self.path(name) + '.tmp', 'w') as f:
            json.dump(value, f, indent=2)
        os.replace(self.path(name) + '.tmp', self.path(name))
        return value


def pretrain_config(base: str, variant: str, seed: int, schedule: dict, data_root: str,
                    work_dir: str, probe: bool = True) -> Config:
    """The pretraining config of one row: ``base`` with the variant's model and the
    schedule's recipe options (``cfg_options``, the ViT's only), the seed, the schedule's
    epochs, images (less the validation images with ``validation``) and batch."""
    cfg = Config.fromfile(base)
    cfg.merge_from_dict(dict(model=VARIANTS[variant]))  # nested dicts merge, None replaces
    if base != SWIN_CONFIG and schedule.get('cfg_options'):
        cfg.merge_from_dict(schedule['cfg_options'])
    objects = osp.join(data_root, 'objects')
    dataset = cfg.train_dataloader.dataset
    dataset.data_root = objects
    if schedule.get('validation'):
        fit, val = split_indices(data_root, schedule)
        dataset.indices = fit
    if schedule.get('batch_size'):
        cfg.train_dataloader.batch_size = schedule['batch_size']
    cfg.randomness = dict(cfg.get('randomness') or {}, seed=seed)  # keeps diff_rank_seed
    cfg.work_dir = work_dir
    _set_epochs(cfg, schedule['epochs'])
    # The config's k-NN probe (KNNProbeHook): this data root's train images against its
    # test images, or with ``validation`` the fitting images against the validation ones.
    hooks = [h for h in cfg.custom_hooks if h.type != 'KNNProbeHook']
    for hook in cfg.custom_hooks:
        if hook.type == 'KNNProbeHook' and probe:
            hook.interval = schedule.get('probe_interval') or hook.interval
            reference = hook.reference_dataloader.dataset
            query = hook.query_dataloader.dataset
            reference.data_root = osp.join(objects, 'train')
            if schedule.get('validation'):
                reference.indices, query.indices = fit, val
                query.data_root = osp.join(objects, 'train')
            else:
                query.data_root = osp.join(objects, 'test')
            hooks.append(hook)
    cfg.custom_hooks = hooks
    return cfg


def split_indices(data_root: str, schedule: dict) -> Tuple[List[int], List[int]]:
    """Indices into the training folder (``CustomDataset`` order) of the images that train
    and of the validation images (none without ``validation``)."""
    from mst_mm.evidence.animal_shapes import validation_split
    from mst_mm.evidence.frozen_features import class_folder_files
    _, labels = class_folder_files(osp.join(data_root, 'objects', 'train'))
    if schedule.get('validation'):
        fit, val = (part.tolist() for part in validation_split(labels.numpy()))
    else:
        fit, val = list(range(len(labels))), []
    return fit, val


def _set_epochs(cfg: Config, epochs: int) -> None:
    """The whole schedule, warm-ups included, scaled to ``epochs``; a checkpoint every epoch."""
    old = cfg.train_cfg.max_epochs
    scale = epochs / old
    cfg.train_cfg.max_epochs = epochs
    for scheduler in cfg.param_scheduler:
        scheduler.begin = round(scheduler.begin * scale)
        scheduler.end = max(round(scheduler.end * scale), scheduler.begin + 1)
    for hook in cfg.custom_hooks:
        if hook.type == 'TeacherTempWarmupHook':
            hook.warmup_epochs = round(hook.warmup_epochs * scale)
        if hook.type == 'FreezeLastLayerHook':
            hook.freeze_epochs = min(hook.freeze_epochs, max(epochs - 1, 0))
    cfg.default_hooks.checkpoint.interval = 1
    cfg.default_hooks.checkpoint.max_keep_ckpts = epochs


def pretrain(cfg: Config) -> List[str]:
    """Train (or resume, or skip when finished); the checkpoints of every epoch."""
    from mst_mm.engine import build_runner
    final = osp.join(cfg.work_dir, f'epoch_{cfg.train_cfg.max_epochs}.pth')
    if not osp.isfile(final):
        cfg.resume = osp.isfile(osp.join(cfg.work_dir, 'last_checkpoint'))
        build_runner(cfg).train()
    return [osp.join(cfg.work_dir, f'epoch_{e}.pth')
            for e in range(1, cfg.train_cfg.max_epochs + 1)]


def build_model(cfg: Config, checkpoint: Optional[str], seed: int):
    """The MST model of ``cfg`` with a checkpoint's weights, or randomly initialised."""
    from mmengine.runner import set_random_seed
    from mmpretrain.registry import MODELS

    from mst_mm.engine.safe_loading import read_checkpoint
    set_random_seed(seed)
    model = MODELS.build(cfg.model)
    if checkpoint is None:
        model.init_weights()
    else:
        model.load_state_dict(read_checkpoint(checkpoint, map_location='cpu')['state_dict'])
    return model.eval()


class Probe:
    """The held-out evaluations of one backbone: k-NN, linear probe, frozen patch probe and
    guidance shares."""

    def __init__(self, data_root: str, validation: bool = False, patch_size: int = 4) -> None:
        """The train images against the test images; with ``validation``, the fitting
        images against the validation images carved from the train images (the test
        images are not read). ``patch_size``: the raw-pixels row's patches (the ViT's)."""
        from mst_mm.evidence.patch_probe import masked_splits
        self.train, self.test = masked_splits(osp.join(data_root, 'objects'), validation)
        self.train_images, self.train_labels = self.train.images, self.train.classes - 1
        self.test_images, self.test_labels = self.test.images, self.test.classes - 1
        self.test_masks = self.test.masks
        self.patch_size = patch_size

    def raw_pixels(self) -> dict:
        from mst_mm.evaluation import knn_top1, linear_probe_top1
        train = torch.from_numpy(self.train_images).flatten(1).float()
        test = torch.from_numpy(self.test_images).flatten(1).float()
        return dict(knn_top1=knn_top1(train, self.train_labels, test, self.test_labels,
                                      ks=(KNN_K, ))[KNN_K],
                    linear_top1=linear_probe_top1(train, self.train_labels, test,
                                                  self.test_labels),
                    **self.patches())

    def patches(self, backbone=None, mean=(), std=()) -> dict:
        """The frozen patch probe (its default settings, chosen on the validation split:
        ``mst_mm.evaluation.patch_probe``) of the backbone's last-layer patch
        tokens, or of each patch's raw pixels with ``backbone=None``: mIoU (%) over
        background and the classes, at the patch grid and at the pixels."""
        from mst_mm.evidence.patch_probe import probe_patches
        result = probe_patches(self.train, self.test, backbone, mean, std,
                               patch_size=self.patch_size)
        return dict(patch_probe_miou=result['patch_miou'],
                    patch_probe_pixel_miou=result['pixel_miou'])

    def model(self, model, classify: bool = True) -> dict:
        """The EMA teacher's backbone of an MST model."""
        return self.backbone(*teacher_of(model), classify)

    def backbone(self, backbone, mean, std, classify: bool = True) -> dict:
        from mst_mm.evaluation import knn_top1, linear_probe_top1
        from mst_mm.evidence.frozen_features import image_batches
        from mst_mm.evidence.guidance import guidance_shares, patch_object_mask
        from mst_mm.models.algorithms.feature_embedder import embed_images
        test_feats, attn = embed_images(backbone, image_batches(self.test_images), mean, std,
                                        with_attn=True)
        patch = self.test_masks.shape[-1] // int(math.isqrt(attn.shape[1]))
        result = guidance_shares(attn, patch_object_mask(self.test_masks, patch), NUM, P)
        if classify:
            train_feats, _ = embed_images(backbone, image_batches(self.train_images), mean, std)
            result['knn_top1'] = knn_top1(train_feats, self.train_labels, test_feats,
                                          self.test_labels, ks=(KNN_K, ))[KNN_K]
            result['linear_top1'] = linear_probe_top1(train_feats, self.train_labels,
                                                      test_feats, self.test_labels)
            result.update(self.patches(backbone, mean, std))
        return result

    def complete(self, load):
        """For :meth:`Store.get`: the patch probe of a row stored without it, its backbone
        ``load(row['checkpoint'])`` as (backbone, mean, std) (None: the raw pixels)."""
        def missing(row: dict) -> dict:
            if 'patch_probe_miou' in row:
                return {}
            return self.patches(*load(row['checkpoint'])) if load else self.patches()
        return missing


def teacher_of(model) -> tuple:
    """(the EMA teacher's backbone, mean, std) of an MST model."""
    return (model.teacher.module[0], model.data_preprocessor.mean,
            model.data_preprocessor.std)


def pretrained_row(store: Store, probe: Probe, variant: str, seed: int, schedule: dict,
                   data_root: str, out: str, guidance_curve: bool) -> dict:
    """Pretrain one variant and seed, probe its last teacher (and, for the guidance curve,
    the teacher of every epoch)."""
    from mst_mm.visualization import final_values, read_scalars
    name = f'{variant}_seed{seed}'
    work_dir = osp.join(out, 'pretrain', name)
    cfg = pretrain_config(schedule['config'], variant, seed, schedule, data_root, work_dir)

    def compute() -> dict:
        checkpoints = pretrain(cfg)
        row = probe.model(build_model(cfg, checkpoints[-1], seed))
        scalars = read_scalars(work_dir, all_runs=True)
        row.update(final_values(scalars))
        # The hook logs at epoch ends, by iteration; the loop drops the last partial batch.
        iters_per_epoch = len(split_indices(data_root, schedule)[0]) // \
            cfg.train_dataloader.batch_size
        probe_key = f'knn_probe_top1_k{KNN_K}'
        row['knn_probe'] = [[r['step'] // iters_per_epoch, r[probe_key]]
                            for r in scalars if probe_key in r]
        if guidance_curve:
            row['guidance_by_epoch'] = [
                dict(epoch=e, **probe.model(build_model(cfg, ckpt, seed), classify=False))
                for e, ckpt in enumerate(checkpoints, 1)]
        row['checkpoint'] = checkpoints[-1]
        return row

    return store.get(name, compute, probe.complete(
        lambda checkpoint: teacher_of(build_model(cfg, checkpoint, seed))))


def random_init_row(store: Store, probe: Probe, seed: int, schedule: dict, data_root: str,
                    out: str) -> dict:
    path = osp.join(out, 'random_init', f'seed{seed}.pth')
    cfg = pretrain_config(schedule['config'], 'mst_guided_mask', seed, dict(schedule, epochs=1),
                          data_root, out, probe=False)

    def compute() -> dict:
        model = build_model(cfg, None, seed)
        os.makedirs(osp.dirname(path), exist_ok=True)
        torch.save({'state_dict': model.state_dict()}, path)
        return dict(probe.model(model), checkpoint=path)

    return store.get(f'random_init_seed{seed}', compute, probe.complete(
        lambda checkpoint: teacher_of(build_model(cfg, checkpoint, seed))))


def supervised_row(store: Store, probe: Probe, seed: int, schedule: dict, data_root: str,
                   out: str) -> dict:
    """The ceiling: the same ViT trained with labels on the same images and epochs."""
    from mst_mm.evidence.supervised import load_supervised_backbone, train_supervised
    cfg = pretrain_config(schedule['config'], 'dino', seed, schedule, data_root, out,
                          probe=False)

    def compute() -> dict:
        indices = split_indices(data_root, schedule)[0] if schedule.get('validation') else None
        checkpoint = train_supervised(cfg, osp.join(data_root, 'objects'),
                                      osp.join(out, 'supervised', f'seed{seed}'),
                                      schedule['epochs'], seed, indices,
                                      schedule.get('batch_size'))
        return dict(probe.backbone(*load_supervised_backbone(checkpoint, cfg)),
                    checkpoint=checkpoint)

    return store.get(f'supervised_seed{seed}', compute, probe.complete(
        lambda checkpoint: load_supervised_backbone(checkpoint, cfg)))


# -------------------------------------------------------------------------- transfer
def swin_row(store: Store, variant: str, schedule: dict, data_root: str, out: str) -> dict:
    """The MaskSwin-nano pretraining that Mask R-CNN starts from (one seed)."""
    name = f'swin_{variant}_seed0'
    cfg = pretrain_config(SWIN_CONFIG, variant, 0, schedule, data_root,
                          osp.join(out, 'pretrain', name), probe=False)
    return store.get(name, lambda: dict(checkpoint=pretrain(cfg)[-1]))


def finetune_row(store: Store, target: str, start: str, ft_seed: int, schedule: dict,
                 data_root: str, out: str, frozen: bool = False) -> dict:
    """Mask R-CNN (MaskSwin-nano, ``mmdet``) or SETR (ViT, ``mmseg``) fine-tuned on the scenes
    from the ``start`` row's checkpoint (Mask R-CNN's random init is mmdet's own); with
    ``frozen``, the backbone stays as initialised and only the neck and heads train."""
    from mst_mm.evidence.transfer import finetune
    if target == 'mmdet':
        checkpoint = None if start == 'random_init' else store.load(f'swin_{start}_seed0')
    else:
        checkpoint = store.load(f'{start}_seed0')
    checkpoint = checkpoint and checkpoint['checkpoint']
    config = DET_CONFIG if target == 'mmdet' else SEG_CONFIG
    options = None
    if schedule['finetune'] == 'quick':
        options = dict(train_cfg=dict(max_iters=20, val_interval=20))
    name = f"{target}{'_frozen' if frozen else ''}_{start}_ft{ft_seed}"
    return store.get(name, lambda: finetune(config, checkpoint, osp.join(out, 'transfer', name),
                                            osp.join(data_root, 'scenes'), ft_seed, target,
                                            options, frozen_backbone=frozen))


def transfer_rows(store: Store, schedule: dict, data_root: str, out: str) -> dict:
    """Every fine-tune of the schedule's targets, from the stored random-init, DINO and
    MST-guided seed-0 rows."""
    targets = schedule['transfer_targets']
    if 'mmdet' in targets:
        for variant in TRANSFER_FROM[1:]:
            swin_row(store, variant, schedule, data_root, out)
    result = {f'{target}{suffix}': {} for suffix in ('', '_frozen') for target in targets}
    for start in TRANSFER_FROM:
        for target in targets:
            for frozen in (False, True):
                runs = [finetune_row(store, target, start, ft_seed, schedule, data_root, out,
                                     frozen)
                        for ft_seed in range(schedule['finetune_seeds'])]
                result[target + ('_frozen' if frozen else '')][start] = {
                    key: [r[key] for r in runs] for key in runs[0]}
    return result


# ----------------------------------------------------------------------------- lanes
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
    return [first, [f'{target}{frozen}_{start}_ft{s}' for start in TRANSFER_FROM
                    for target in targets for frozen in ('', '_frozen')
                    for s in range(schedule['finetune_seeds'])]]


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


def run_unit(name: str, store: Store, probe: 'Probe', schedule: dict, data_root: str,
             out: str) -> dict:
    """One unit by its name in :func:`plan_units`."""
    if name.startswith('random_init_seed'):
        return random_init_row(store, probe, int(name.rpartition('seed')[2]), schedule,
                               data_root, out)
    if name.startswith('supervised_seed'):
        return supervised_row(store, probe, int(name.rpartition('seed')[2]), schedule,
                              data_root, out)
    kind, _, rest = name.partition('_')
    if kind in ('mmdet', 'mmseg'):
        frozen = rest.startswith('frozen_')
        start, _, ft_seed = rest.removeprefix('frozen_').rpartition('_ft')
        return finetune_row(store, kind, start, int(ft_seed), schedule, data_root, out,
                            frozen)
    if kind == 'swin':
        return swin_row(store, rest.rpartition('_seed')[0], schedule, data_root, out)
    variant, _, seed = name.rpartition('_seed')
    return pretrained_row(store, probe, variant, int(seed), schedule, data_root, out,
                          guidance_curve=seed == '0')


def run_lanes(stages: List[List[str]], jobs: int, argv: List[str], store: Store,
              out: str) -> None:
    """Each stage's unfinished units in ``jobs`` processes side by side; their logs go to
    ``OUT/lanes/``. Every unit seeds itself, so the numbers do not depend on ``jobs``."""
    os.makedirs(osp.join(out, 'lanes'), exist_ok=True)
    for index, names in enumerate(stages, 1):
        pending = [n for n in names if not osp.isfile(store.path(n))]
        lanes = []
        for lane, units in enumerate(split_lanes(pending, jobs)):
            log = osp.join(out, 'lanes', f'stage{index}_lane{lane}.log')
            print(f'stage {index}, lane {lane}: {len(units)} unit(s), log {log}', flush=True)
            with open(log, 'a') as f:
                lanes.append((subprocess.Popen(
                    [sys.executable, osp.abspath(__file__), *argv, '--jobs', '1',
                     '--units', ','.join(units)], stdout=f, stderr=subprocess.STDOUT), log))
        failed = [log for process, log in lanes if process.wait() != 0]
        if failed:
            raise SystemExit(f"a lane failed; the end of {', '.join(failed)} says why. "
                             'Finished units are kept: run the same command again to go on.')


# --------------------------------------------------------------------------- summary
def mean_std(values: List[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f'{values[0]:.{digits}f}'
    return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def patch_probe_settings() -> dict:
    """Every setting of the patch probe, as its results write them (the lr filled in)."""
    from mst_mm.evaluation.patch_probe import DEFAULT_LR, DEFAULT_SETTINGS
    settings = dict(DEFAULT_SETTINGS)
    settings['lr'] = settings['lr'] or DEFAULT_LR[settings['optimizer']]
    return settings


def make_summary(num_prototypes: int, image_views_per_run: int, raw: dict,
                 random_init: List[dict], supervised: List[dict],
                 rows: Dict[str, List[dict]], transfer: Optional[dict]) -> dict:
    guidance_keys = ('attention_on_object_share', 'candidates_on_object_share',
                     'masked_on_object_share')

    def every_row(key: str) -> dict:
        return dict(raw_pixels=raw[key], random_init=[r[key] for r in random_init],
                    supervised=[r[key] for r in supervised],
                    **{v: [r[key] for r in runs] for v, runs in rows.items()})

    summary = dict(
        ln_k=math.log(num_prototypes),
        image_views_per_run=image_views_per_run,
        knn_top1=every_row('knn_top1'),
        linear_top1=every_row('linear_top1'),
        patch_probe_miou=every_row('patch_probe_miou'),
        patch_probe_pixel_miou=every_row('patch_probe_pixel_miou'),
        patch_probe_settings=patch_probe_settings(),
        last_loss_dino={v: [r['loss_dino'] for r in runs] for v, runs in rows.items()},
        knn_probe={v: [r['knn_probe'] for r in runs] for v, runs in rows.items()},
        guidance=dict(object_area_share=random_init[0]['object_area_share'],
                      **{v: {k: [r[k] for r in runs] for k in guidance_keys}
                         for v, runs in rows.items()}),
        transfer=transfer)
    return summary


def format_table(summary: dict, seeds: Dict[str, int]) -> str:
    lines = [f"k-NN (k = {KNN_K}, T = 0.07) and linear-probe top-1 (%) on the 2,000 held-out "
             'object images, the frozen patch probe\'s mIoU (%, background and 10 classes, '
             f"at the patch grid), last DINO loss (ln K = {summary['ln_k']:.3f}), and the "
             'share of the teacher\'s CLS attention, of the guided mask\'s candidates and of '
             'its masked patches on the object (the object covers '
             f"{summary['guidance']['object_area_share']:.3f} of the patches). Mean ± std "
             'over seeds.', '',
             '| features | seeds | k-NN | linear | patch mIoU | last loss_dino '
             '| attention on object | candidates on object | masked on object |',
             '| --- | --- | --- | --- | --- | --- | --- | --- | --- |']
    knn, lin = summary['knn_top1'], summary['linear_top1']
    patch = summary.get('patch_probe_miou', {})

    def probes(row: str) -> str:
        """k-NN, linear and patch-probe cells; a patch probe of fewer seeds than the row's
        (one recomputed from the committed seed-0 checkpoints) says how many."""
        values = patch.get(row)
        if values is None:
            cell = '-'
        elif row == 'raw_pixels':
            cell = f'{values:.1f}'
        else:
            n = len(knn[row])
            cell = mean_std(values) + (f' ({len(values)} of {n} seeds)' if len(values) < n
                                       else '')
        if row == 'raw_pixels':
            return f"{knn[row]:.1f} | {lin[row]:.1f} | {cell}"
        return f"{mean_std(knn[row])} | {mean_std(lin[row])} | {cell}"

    lines.append(f"| raw pixels | - | {probes('raw_pixels')} | - | - | - | - |")
    lines.append(f"| random init | {len(knn['random_init'])} | {probes('random_init')} "
                 '| - | - | - | - |')
    if knn.get('supervised'):   # the ceiling: the same ViT trained with labels
        lines.append(f"| supervised | {len(knn['supervised'])} | {probes('supervised')} "
                     '| - | - | - | - |')
    for variant in VARIANTS:
        if variant not in summary['last_loss_dino']:
            continue
        g = summary['guidance'][variant]
        lines.append(
            f"| {variant} | {seeds[variant]} | {probes(variant)} "
            f"| {mean_std(summary['last_loss_dino'][variant], 3)} "
            f"| {mean_std(g['attention_on_object_share'], 3)} "
            f"| {mean_std(g['candidates_on_object_share'], 3)} "
            f"| {mean_std(g['masked_on_object_share'], 3)} |")
    transfer = summary.get('transfer')
    if transfer:
        lines += ['', 'Transfer to the scenes: Mask R-CNN box / mask mAP (MaskSwin-nano) and '
                  'SETR-naive mIoU (ViT), mean ± std over fine-tune seeds.', '',
                  '| initialisation | box mAP | mask mAP | mIoU |', '| --- | --- | --- | --- |']
        # Fine-tuned, then (where the run has them) with the backbone frozen; a target the
        # run left out (--transfer-targets) shows as '-'.
        for suffix in ('', '_frozen'):
            if not any(target + suffix in transfer for target in TRANSFER_TARGETS):
                continue
            for start in TRANSFER_FROM:
                det = transfer.get('mmdet' + suffix, {}).get(start)
                seg = transfer.get('mmseg' + suffix, {}).get(start)
                cells = [mean_std(det['bbox_mAP'], 3), mean_std(det['segm_mAP'], 3)] if det \
                    else ['-', '-']
                cells.append(mean_std(seg['mIoU'], 2) if seg else '-')
                lines.append(f"| {start}{', frozen backbone' if suffix else ''} | "
                             + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


# ---------------------------------------------------------------------------- pictures
def write_pictures(rows: Dict[str, List[dict]], summary: dict, schedule: dict, out: str,
                   data_root: str) -> List[str]:
    from mst_mm.visualization import plot_dino_curves, read_scalars
    pictures = osp.join(out, 'pictures')
    os.makedirs(pictures, exist_ok=True)
    curves = {v: [read_scalars(osp.dirname(r["checkpoint"]), all_runs=True) for r in runs]
              for v, runs in rows.items()}
    written = [plot_dino_curves(curves, round(math.exp(summary['ln_k'])),
                                osp.join(pictures, 'pretraining_curves.png'),
                                title='evidence pretraining, every seed')]
    written.append(plot_guidance_by_epoch(rows, summary['guidance']['object_area_share'],
                                          osp.join(pictures, 'guidance_by_epoch.png')))
    guided = rows.get('mst_guided_mask')
    if guided:
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            'visualize_mst', osp.join(REPO, 'tools', 'analysis', 'visualize_mst.py'))
        tool = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool)
        images = class_examples(data_root)
        # The model as this code names it (not the run's dumped config, which keeps the
        # registry names of the code that trained it).
        cfg = pretrain_config(schedule['config'], 'mst_guided_mask', 0, dict(schedule, epochs=1),
                              data_root, osp.dirname(guided[0]['checkpoint']), probe=False)
        with tempfile.TemporaryDirectory() as tmp:
            config = osp.join(tmp, osp.basename(schedule['config']))
            cfg.dump(config)
            written.append(tool.main([config, guided[0]['checkpoint'], *images, '--out-dir',
                                      pictures, '--grid', '--size', '96'])[-1])
        written.append(evidence_figure(build_model(cfg, guided[0]['checkpoint'], 0), summary,
                                       images, osp.join(pictures, 'evidence.png')))
    return written


def evidence_figure(model, summary: dict, images: List[str], path: str,
                    reconstruct: bool = True) -> str:
    """The README's picture: the MST-guided teacher's attention and masks on the first four
    ``images`` (with the decoder's reconstruction), over every variant's k-NN probe curves."""
    from mst_mm.visualization import load_image, mst_picture_row, plot_evidence_figure
    grid = [mst_picture_row(model, load_image(image, 96, model),
                            torch.Generator().manual_seed(i),
                            label=osp.basename(osp.dirname(image)), reconstruct=reconstruct)
            for i, image in enumerate(images[:4])]
    knn = summary['knn_top1']
    references = {'raw pixels': knn['raw_pixels'],
                  'random init': statistics.mean(knn['random_init'])}
    if knn.get('supervised'):
        references['supervised'] = statistics.mean(knn['supervised'])
    return plot_evidence_figure(grid, summary['knn_probe'], references, path)


def plot_guidance_by_epoch(rows: Dict[str, List[dict]], area: float, path: str) -> str:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for variant, runs in rows.items():
        curve = runs[0].get('guidance_by_epoch')
        if not curve:
            continue
        epochs = [c['epoch'] for c in curve]
        axes[0].plot(epochs, [c['attention_on_object_share'] for c in curve], marker='o',
                     label=variant)
        axes[1].plot(epochs, [c['candidates_on_object_share'] for c in curve], marker='o',
                     label=variant)
    titles = ('CLS attention mass on the object', 'guided-mask candidates on the object')
    for ax, title in zip(axes, titles):
        ax.axhline(area, color='grey', linestyle='--', label='object area (= random)')
        ax.set_title(title, fontsize=10)
        ax.set_xlabel('epoch (seed 0)')
        ax.set_ylim(0, 1)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -------------------------------------------------------------------------------- main
def prepare_data(data_root: Optional[str], transfer: bool) -> str:
    """The default data folder is written on the first run; a given one must exist."""
    from mst_mm.evidence.animal_shapes import write_object_images, write_scenes
    if data_root is None:
        write_object_images(osp.join(DEFAULT_DATA_ROOT, 'objects'))
        write_scenes(osp.join(DEFAULT_DATA_ROOT, 'scenes'))
        return DEFAULT_DATA_ROOT
    needed = ['objects/dataset.json'] + (['scenes/dataset.json'] if transfer else [])
    missing = [n for n in needed if not osp.isfile(osp.join(data_root, n))]
    if missing:
        raise SystemExit(f"--data-root {data_root} lacks {', '.join(missing)}: write it with "
                         f'python tools/misc/write_animal_shapes.py {data_root}, or leave '
                         f'--data-root out to use {DEFAULT_DATA_ROOT}.')
    return data_root


def make_schedule(args: argparse.Namespace) -> dict:
    """The run's schedule: the quick or full one, with the command line's choices."""
    schedule = dict(SCHEDULES['quick' if args.quick else 'full'])
    schedule['seeds'] = {v: args.seeds or schedule['seeds'][v] for v in args.variants}
    schedule['supervised_seeds'] = next(n for n in (
        args.supervised_seeds, args.seeds, schedule['supervised_seeds']) if n is not None)
    schedule['batch_size'] = args.batch_size
    schedule['config'] = osp.abspath(args.config)
    schedule['epochs'] = (args.epochs or schedule['epochs']
                          or Config.fromfile(args.config).train_cfg.max_epochs)
    schedule.update(transfer_targets=args.transfer_targets, validation=args.validation,
                    probe_interval=args.probe_interval,
                    cfg_options=args.cfg_options)
    return schedule


def main(argv=None) -> dict:
    args = parse_args(argv)
    import mst_mm  # noqa: F401
    torch.set_num_threads(args.threads)
    schedule = make_schedule(args)
    out = args.out or ('work_dirs/evidence_quick' if args.quick else 'work_dirs/evidence')
    data_root = prepare_data(args.data_root, transfer=bool(args.transfer_targets)
                             and not args.from_checkpoints)
    probe = Probe(data_root, validation=args.validation,
                  patch_size=Config.fromfile(schedule['config']).model.backbone.patch_size)
    if args.only:
        return rerun_row(args.only, probe, schedule, data_root, out)
    if args.from_checkpoints:
        return from_checkpoints(args.from_checkpoints, probe, schedule, data_root, out)

    store = Store(out)
    if args.units:
        for name in args.units.split(','):
            run_unit(name, store, probe, schedule, data_root, out)
        return {}
    if args.jobs > 1:
        argv = sys.argv[1:] if argv is None else list(argv)
        run_lanes(plan_units(schedule), args.jobs, argv, store, out)
    raw = store.get('raw_pixels', probe.raw_pixels, probe.complete(None))
    max_seeds = max(schedule['seeds'].values())
    random_init = [random_init_row(store, probe, s, schedule, data_root, out)
                   for s in range(max_seeds)]
    rows = {v: [pretrained_row(store, probe, v, s, schedule, data_root, out,
                               guidance_curve=s == 0)
                for s in range(n)]
            for v, n in schedule['seeds'].items()}
    transfer = (transfer_rows(store, schedule, data_root, out)
                if schedule['transfer_targets'] else None)
    num_prototypes = Config.fromfile(schedule['config']).model.head.out_channels
    image_views = schedule['epochs'] * len(split_indices(data_root, schedule)[0])
    supervised = [supervised_row(store, probe, s, schedule, data_root, out)
                  for s in range(schedule['supervised_seeds'])]
    summary = make_summary(num_prototypes, image_views, raw, random_init, supervised, rows,
                           transfer)
    with open(osp.join(out, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=2)
    table = format_table(summary, schedule['seeds'])
    with open(osp.join(out, 'evidence_table.md'), 'w') as f:
        f.write(table + '\n')
    pictures = write_pictures(rows, summary, schedule, out, data_root)
    print('\n' + table)
    print(f"\nschedule: {schedule['epochs']} epochs of {image_views // schedule['epochs']:,} "
          f"images ({image_views:,} image-views per run), "
          f"{osp.relpath(schedule['config'], REPO)}; the committed runs' tables: "
          'docs/evidence.md')
    print(f"summary: {osp.join(out, 'summary.json')}\npictures: {', '.join(pictures)}")
    return summary


def from_checkpoints(run_dir: str, probe: Probe, schedule: dict, data_root: str,
                     out: str) -> dict:
    """A finished run's probes, guidance shares and evidence picture, recomputed from the
    teacher backbones it committed (``RUN_DIR/checkpoints/ROW_seedS.pth``, ROW a variant or
    ``supervised``, seeds 0, 1, ... of a row) and its random-init seeds (rebuilt from the
    seed): ``RUN_DIR/summary.json`` with the recomputed values in place of the committed ones
    (and the patch probe added), written to ``OUT/summary.json``. The loss and k-NN probe
    curves, the per-epoch guidance and the transfer rows come from training: kept as
    committed. Prints each recomputed value that differs from the committed one at its
    printed digit (another CPU may differ in the last digit)."""
    from mst_mm.evaluation.patch_probe import load_frozen_backbone
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
    summary, differences = recomputed_summary(committed, results)
    with open(osp.join(out, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=2)
    seeds = {v: len(summary['knn_top1'][v]) for v in VARIANTS if v in summary['knn_top1']}
    table = format_table(summary, seeds)
    with open(osp.join(out, 'evidence_table.md'), 'w') as f:
        f.write(table + '\n')
    pictures = []
    if results.get('mst_guided_mask'):   # the teacher's attention and masks, no decoder
        model = build_model(pretrain_config(schedule['config'], 'mst_guided_mask', 0,
                                            dict(schedule, epochs=1), data_root, out,
                                            probe=False), None, 0)
        model.teacher.module[0] = load_frozen_backbone(cfg.model.backbone,
                                                       results['mst_guided_mask'][0]['checkpoint'])
        os.makedirs(osp.join(out, 'pictures'), exist_ok=True)
        pictures.append(evidence_figure(model, summary, class_examples(data_root),
                                        osp.join(out, 'pictures', 'evidence.png'),
                                        reconstruct=False))
    print('\n' + table)
    print(f'\nrecomputed from {len(files)} checkpoint(s) of {run_dir}, the raw pixels and '
          f"{len(results['random_init'])} random-init seed(s): {osp.join(out, 'summary.json')}; "
          f"pictures: {', '.join(pictures) or 'none (no mst_guided_mask checkpoint)'}")
    print('\n'.join(differences) if differences else
          'every recomputed value equals the committed one to its printed digit')
    return summary


# (summary key, guidance key or None, printed digits) of every value a checkpoint gives.
RECOMPUTED = (('knn_top1', None, 1), ('linear_top1', None, 1),
              ('patch_probe_miou', None, 1), ('patch_probe_pixel_miou', None, 1),
              *(('guidance', key, 3) for key in ('attention_on_object_share',
                                                 'candidates_on_object_share',
                                                 'masked_on_object_share')))


def recomputed_summary(committed: dict, results: Dict[str, List[dict]]
                       ) -> Tuple[dict, List[str]]:
    """``committed`` with the values of ``results`` (row -> the seeds' probe results) in
    place, seed by seed, and a line for each that differs at its printed digit."""
    summary = copy.deepcopy(committed)
    differences = []
    for key, sub, digits in RECOMPUTED:
        for row, runs in results.items():
            if sub and row not in VARIANTS:   # guidance shares: the pretrained rows'
                continue
            table = summary.setdefault(key, {})
            table = table.setdefault(row, {}) if sub else table
            name = sub or row
            old = table.get(name)
            old = [old] if row == 'raw_pixels' and old is not None else list(old or [])
            new = [r[sub or key] for r in runs]
            for seed, value in enumerate(new):
                if seed < len(old) and f'{old[seed]:.{digits}f}' != f'{value:.{digits}f}':
                    differences.append(f'{key} {row}{" " + sub if sub else ""} seed {seed}: '
                                       f'committed {old[seed]:.{digits}f}, recomputed '
                                       f'{value:.{digits}f}')
            merged = new + old[len(new):]
            table[name] = merged[0] if row == 'raw_pixels' else merged
    summary['patch_probe_settings'] = patch_probe_settings()
    return summary, differences


def class_examples(data_root: str) -> List[str]:
    """The first test image of every class."""
    test = osp.join(data_root, 'objects', 'test')
    return [sorted(glob.glob(osp.join(test, c, '*.png')))[0] for c in sorted(os.listdir(test))]


def rerun_row(only: str, probe: Probe, schedule: dict, data_root: str, out: str) -> dict:
    variant, _, seed = only.partition(':')
    if variant not in VARIANTS or not seed.isdigit():
        raise SystemExit(f"--only takes VARIANT:SEED with VARIANT one of {', '.join(VARIANTS)}, "
                         f'e.g. mst_guided_mask:1; got {only!r}.')
    rerun_dir = osp.join(out, 'rerun')
    row = pretrained_row(Store(rerun_dir), probe, variant, int(seed), schedule, data_root,
                         rerun_dir, guidance_curve=False)
    print(f'{variant}, seed {seed}: k-NN {row["knn_top1"]:.1f}, linear {row["linear_top1"]:.1f}, '
          f'last loss_dino {row["loss_dino"]:.3f}, attention on object '
          f'{row["attention_on_object_share"]:.3f}, candidates on object '
          f'{row["candidates_on_object_share"]:.3f}')
    summary_path = osp.join(out, 'summary.json')
    if osp.isfile(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        print(f"the full run's {variant} row: k-NN {mean_std(summary['knn_top1'][variant])}, "
              f"linear {mean_std(summary['linear_top1'][variant])}")
    return row


if __name__ == '__main__':
    main()
