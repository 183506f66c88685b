"""What the evidence run writes: its summary and markdown table, the comparison of recomputed
values with committed ones, and its pictures: the training curves of every seed, the guidance
by epoch, MST's attention and masks, and the README's evidence figure.
"""
import copy
import glob
import json
import math
import os
import os.path as osp
import statistics
from itertools import cycle
from typing import Dict, List, Optional, Tuple

import matplotlib
import matplotlib.pyplot as plt
import mmcv
import numpy as np
import torch
import torch.nn as nn

from mst_mm.converters import load_model
from mst_mm.visualization import draw_rows, load_image, mst_picture_row, render_rows
from mst_mm.visualization.mst_pictures import column_titles

from .bench import git_commit
from .data import write_json
from .patch_probe import load_frozen_backbone, probe_settings
from .recipes import KNN_K, TRANSFER_FROM, TRANSFER_TARGETS, VARIANTS, pretrain_config

matplotlib.use('Agg')   # pictures go to files: no display needed
CURVE_KEYS = ('loss_dino', 'teacher_entropy', 'teacher_student_kl')
PROBE_PREFIX = 'knn_probe_top1_k'
GUIDANCE_KEYS = ('attention_on_object_share', 'candidates_on_object_share',
                 'masked_on_object_share')


def read_scalars(work_dir: str, all_runs: bool = False) -> List[dict]:
    """The per-iteration rows, in order, that mmengine's ``LocalVisBackend`` wrote for the
    latest run in ``work_dir`` (``<timestamp>/vis_data/scalars.json``), or with ``all_runs``
    for every run in it, oldest first (a resumed run writes a folder of its own)."""
    files = sorted(glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json')))
    if not files:
        raise FileNotFoundError(f'No */vis_data/scalars.json under {work_dir}: was the run '
                                'logged with LocalVisBackend (the default)?')
    rows = []
    for path in (files if all_runs else files[-1:]):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def epoch_means(scalars: List[dict]) -> List[dict]:
    """Each epoch's mean of :data:`CURVE_KEYS` over its logged training rows (from
    :func:`read_scalars`): a run's curves small enough to keep in its row and commit."""
    by_epoch: Dict[int, List[dict]] = {}
    for row in scalars:
        if 'epoch' in row:
            by_epoch.setdefault(row['epoch'], []).append(row)
    return [dict(epoch=epoch, **{key: round(statistics.fmean(r[key] for r in rows), 4)
                                 for key in CURVE_KEYS if all(key in r for r in rows)})
            for epoch, rows in sorted(by_epoch.items())]


def plot_dino_curves(runs: Dict[str, List[List[dict]]], num_prototypes: int,
                     out_file: str, title: str = '', xlabel: str = 'iteration') -> str:
    """Write ``out_file``, a PNG of three panels: ``loss_dino``, teacher entropy and
    teacher-student KL against the iteration, one colour per variant and one line per seed
    (``runs``: variant -> the :func:`read_scalars` rows of each seed), ln K drawn in; and a
    fourth with the k-NN probe's top-1 when a run logged it (``KNNProbeHook``). The x axis
    is each row's ``iter`` (else ``step``), named ``xlabel``."""
    log_k = math.log(num_prototypes)
    probe_keys = sorted({key for seed_runs in runs.values() for rows in seed_runs
                         for row in rows for key in row if key.startswith(PROBE_PREFIX)})
    keys = CURVE_KEYS + tuple(probe_keys[:1])
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4.2))
    labels = dict(loss_dino='DINO loss (unweighted by lambda_1 = 1)',
                  teacher_entropy='teacher entropy H(P_t)',
                  teacher_student_kl='teacher-student KL',
                  **{key: f'k-NN probe top-1 (%), k = {key[len(PROBE_PREFIX):]}'
                     for key in probe_keys})
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for colour, (variant, seed_runs) in zip(colours, runs.items()):
        for seed, rows in enumerate(seed_runs):
            for ax, key in zip(axes, keys):
                # Training rows carry 'iter'; the probe's rows only their 'step' (= iter).
                points = [(row.get('iter', row.get('step')), row[key])
                          for row in rows if key in row]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, color=colour, alpha=0.8, linewidth=1.2,
                            label=variant if seed == 0 else None,
                            marker='o' if key in probe_keys else None, markersize=3)
    for ax, key in zip(axes, keys):
        if key in ('loss_dino', 'teacher_entropy'):
            ax.axhline(log_k, color='black', linestyle='--', linewidth=1,
                       label=f'ln K = {log_k:.3f}')
        ax.set(title=labels[key], xlabel=xlabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(out_file)), exist_ok=True)
    return _save(fig, out_file, dpi=110)


def _save(fig, path: str, dpi: Optional[int] = None) -> str:
    """Write ``fig`` to the PNG ``path``, close it and return ``path``."""
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def draw_evidence_figure(grid_rows: List[Dict[str, np.ndarray]],
                         knn_probe: Dict[str, List[List[List[float]]]],
                         references: Dict[str, float], max_heads: int = 3,
                         title: str = '', width_inches: float = 8.2, dpi: int = 110):
    """The README's figure (close it with ``plt.close``), 900 px wide by default: on top, the
    :func:`draw_rows` grid of ``grid_rows`` (:func:`mst_picture_row` results: input,
    attention, guided and random mask, reconstruction) of an MST-guided teacher; under it,
    the k-NN probe's top-1 per pretraining epoch (``knn_probe``: variant -> one
    ``[[epoch, top1], ...]`` list per seed), one colour per variant, a thin line per seed, a
    thick one for their mean (when the seeds share their epochs), and the ``references``
    (name -> top-1 %, e.g. ``{'raw pixels': 40.9}``) dashed."""
    if not grid_rows:
        raise ValueError('No grid rows: give at least one mst_picture_row result.')
    if not knn_probe:
        raise ValueError('knn_probe is empty: give at least one variant.')
    for variant, seeds in knn_probe.items():
        if not seeds or not all(seeds):
            raise ValueError(f'knn_probe[{variant!r}] has no seeds or a seed without points.')
    panel = width_inches / (len(column_titles(grid_rows, max_heads)) + 0.5)
    heights = [0.3 if title else 0.0, panel * len(grid_rows) + 0.9, 3.0]
    fig = plt.figure(figsize=(width_inches, sum(heights)), dpi=dpi)
    head, top, bottom = fig.subfigures(3, 1, height_ratios=heights)
    if title:
        head.suptitle(title, fontsize=11)
    draw_rows(grid_rows, max_heads=max_heads, panel_inches=panel, fig=top)
    ax = bottom.subplots()
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for colour, (variant, seeds) in zip(colours, knn_probe.items()):
        runs = [np.asarray(points, dtype=float) for points in seeds]
        for run in runs:
            ax.plot(run[:, 0], run[:, 1], color=colour, linewidth=0.8, alpha=0.45)
        label = f"{variant} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        if all(np.array_equal(run[:, 0], runs[0][:, 0]) for run in runs):
            ax.plot(runs[0][:, 0], np.mean([run[:, 1] for run in runs], 0), color=colour,
                    linewidth=2.4, marker='o', markersize=3, label=label + ', mean')
        else:  # seeds probed at different epochs: no mean, the legend names the colour
            ax.lines[-1].set_label(label)
    for (name, value), dashes in zip(references.items(), cycle(((6, 2), (2, 2), (6, 2, 1, 2)))):
        ax.axhline(value, color='0.25', linestyle=(0, dashes), linewidth=1.2,
                   label=f'{name} ({value:.1f})')
    ax.set(xlabel='pretraining epoch', ylabel='k-NN top-1 (%)',
           title='k-NN probe during pretraining (thin: seeds, thick: mean)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='center left', bbox_to_anchor=(1.01, 0.5), frameon=False)
    bottom.subplots_adjust(left=0.08, right=0.7, bottom=0.16, top=0.88)
    return fig


def plot_evidence_figure(grid_rows: List[Dict[str, np.ndarray]],
                         knn_probe: Dict[str, List[List[List[float]]]],
                         references: Dict[str, float], path: str, max_heads: int = 3,
                         title: str = '') -> str:
    """Write :func:`draw_evidence_figure` to the PNG ``path`` and return ``path``."""
    return _save(draw_evidence_figure(grid_rows, knn_probe, references, max_heads, title), path)


def mean_std(values: List[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f'{values[0]:.{digits}f}'
    return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def make_summary(num_prototypes: int, image_views_per_run: int, raw: dict,
                 random_init: List[dict], supervised: List[dict],
                 rows: Dict[str, List[dict]], transfer: Optional[dict]) -> dict:
    def every_row(key: str) -> dict:
        return dict(raw_pixels=raw[key], random_init=[r[key] for r in random_init],
                    supervised=[r[key] for r in supervised],
                    **{v: [r[key] for r in runs] for v, runs in rows.items()})

    return dict(
        ln_k=math.log(num_prototypes),
        image_views_per_run=image_views_per_run,
        knn_top1=every_row('knn_top1'),
        linear_top1=every_row('linear_top1'),
        patch_probe_miou=every_row('patch_probe_miou'),
        patch_probe_pixel_miou=every_row('patch_probe_pixel_miou'),
        patch_probe_settings=probe_settings(),
        last_loss_dino={v: [r['loss_dino'] for r in runs] for v, runs in rows.items()},
        knn_probe={v: [r['knn_probe'] for r in runs] for v, runs in rows.items()},
        guidance=dict(object_area_share=random_init[0]['object_area_share'],
                      **{v: {k: [r[k] for r in runs] for k in GUIDANCE_KEYS}
                         for v, runs in rows.items()}),
        transfer=transfer)


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
    for row in ('random_init', 'supervised'):   # supervised: the ceiling, trained with labels
        if knn.get(row):
            lines.append(f"| {row.replace('_', ' ')} | {len(knn[row])} | {probes(row)} "
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


def format_seed_table(summary: dict, every: int = 10) -> str:
    """Each pretraining seed: its k-NN probe every ``every`` epochs (and its best, with the
    epoch), its k-NN, linear and patch-probe values and its last DINO loss."""
    lines = [f'| run | k-NN probe every {every} epochs (best, epoch) | k-NN | linear '
             '| patch mIoU | last loss_dino |', '| --- | --- | --- | --- | --- | --- |']
    for variant in (v for v in VARIANTS if v in summary['last_loss_dino']):
        patch = summary['patch_probe_miou'][variant]
        for seed, curve in enumerate(summary['knn_probe'][variant]):
            best_epoch, best = max(curve, key=lambda point: (point[1], -point[0]))
            probe = ', '.join(f'{top1:.1f}' for epoch, top1 in curve if epoch % every == 0)
            lines.append(
                f"| {variant} seed {seed} | {probe} ({best:.1f}, {best_epoch}) "
                f"| {summary['knn_top1'][variant][seed]:.1f} "
                f"| {summary['linear_top1'][variant][seed]:.1f} "
                f"| {f'{patch[seed]:.1f}' if seed < len(patch) else '-'} "
                f"| {summary['last_loss_dino'][variant][seed]:.3f} |")
    return '\n'.join(lines)


def write_summary(summary: dict, seeds: Dict[str, int], out: str,
                  commit: Optional[str] = None) -> str:
    """Write ``OUT/summary.json``, with the ``commit`` that wrote it (default: the
    checkout's now) and the seeds of every row but raw pixels added to ``summary`` (its lists
    are in seed order), and ``OUT/evidence_table.md`` (with the seed by seed table); the table."""
    summary.update(commit=commit or git_commit(),
                   seeds={row: list(range(len(values)))
                          for row, values in summary['knn_top1'].items() if row != 'raw_pixels'})
    write_json(osp.join(out, 'summary.json'), summary)
    table = format_table(summary, seeds)
    with open(osp.join(out, 'evidence_table.md'), 'w') as f:
        f.write(table + '\n\n' + format_seed_table(summary) + '\n')
    return table


def guided_model(schedule: dict, data_root: str, out: str,
                 checkpoint: Optional[str] = None, backbone: Optional[str] = None) -> nn.Module:
    """The MST-guided model of seed 0 as this code names it (not as the run's dumped config
    does, which keeps the registry names of the code that trained it), with ``checkpoint``'s
    weights (None: as initialised with seed 0), or with a teacher ``backbone`` alone (as
    ``mst2downstream.py --target mmpretrain`` writes it; the decoder stays untrained)."""
    cfg = pretrain_config(schedule['config'], 'mst_guided_mask', 0, dict(schedule, epochs=1),
                          data_root, out, probe=False)
    model = load_model(cfg, checkpoint, 0)
    if backbone is not None:
        model.teacher.module[0] = load_frozen_backbone(cfg.model.backbone, backbone)
    return model


def curve_rows(row: dict) -> List[dict]:
    """A pretraining row's epoch curves and k-NN probe as :func:`plot_dino_curves` rows, by
    epoch."""
    return [dict(curve, iter=curve['epoch']) for curve in row['curves']] + [
        {'step': epoch, f'{PROBE_PREFIX}{KNN_K}': top1} for epoch, top1 in row['knn_probe']]


def write_pictures(rows: Dict[str, List[dict]], summary: dict, schedule: dict, out: str,
                   data_root: str) -> List[str]:
    """The training curves of every seed (by epoch), the guidance by epoch and, with an
    MST-guided row, its seed 0's pictures and the evidence figure, under ``OUT/pictures``.
    A row committed as a part (:class:`~mst_research.runs.Store`) holds its teacher backbone
    only: its pictures show no reconstruction."""
    pictures = osp.join(out, 'pictures')
    os.makedirs(pictures, exist_ok=True)
    written = [plot_dino_curves({v: [curve_rows(r) for r in runs] for v, runs in rows.items()},
                                round(math.exp(summary['ln_k'])),
                                osp.join(pictures, 'pretraining_curves.png'),
                                title='evidence pretraining, every seed (epoch means)',
                                xlabel='epoch')]
    written.append(plot_guidance_by_epoch(rows, summary['guidance']['object_area_share'],
                                          osp.join(pictures, 'guidance_by_epoch.png')))
    if rows.get('mst_guided_mask'):
        guided = rows['mst_guided_mask'][0]
        model = guided_model(schedule, data_root, out, guided.get('checkpoint'),
                             guided.get('backbone'))
        reconstruct = 'checkpoint' in guided
        images = class_examples(data_root)
        written.append(osp.join(pictures, 'mst_pictures.png'))
        mmcv.imwrite(mmcv.rgb2bgr(render_rows(picture_rows(model, images, reconstruct))),
                     written[-1])
        written.append(evidence_figure(model, summary, images,
                                       osp.join(pictures, 'evidence.png'), reconstruct))
    return written


def picture_rows(model: nn.Module, images: List[str], reconstruct: bool = True) -> List[dict]:
    """``tools/analysis/visualize_mst.py``'s rows of ``images`` at 96 px, each named by its
    class folder: input, attention, guided and random masks, reconstruction."""
    return [mst_picture_row(model, load_image(image, 96, model),
                            generator=torch.Generator().manual_seed(i),
                            label=osp.basename(osp.dirname(image)), reconstruct=reconstruct)
            for i, image in enumerate(images)]


def evidence_figure(model: nn.Module, summary: dict, images: List[str], path: str,
                    reconstruct: bool = True) -> str:
    """The README's picture: the MST-guided teacher's attention and masks on the first four
    ``images`` (with the decoder's reconstruction), over every variant's k-NN probe curves."""
    knn = summary['knn_top1']
    references = {'raw pixels': knn['raw_pixels'],
                  'random init': statistics.mean(knn['random_init'])}
    if knn.get('supervised'):
        references['supervised'] = statistics.mean(knn['supervised'])
    return plot_evidence_figure(picture_rows(model, images[:4], reconstruct),
                                summary['knn_probe'], references, path)


def plot_guidance_by_epoch(rows: Dict[str, List[dict]], area: float, path: str) -> str:
    """Seed 0's attention and guided-mask candidates on the object, epoch by epoch."""
    keys = {'attention_on_object_share': 'CLS attention mass on the object',
            'candidates_on_object_share': 'guided-mask candidates on the object'}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for variant, runs in rows.items():
        curve = runs[0].get('guidance_by_epoch')
        if not curve:
            continue
        for ax, key in zip(axes, keys):
            ax.plot([c['epoch'] for c in curve], [c[key] for c in curve], marker='o',
                    label=variant)
    for ax, title in zip(axes, keys.values()):
        ax.axhline(area, color='grey', linestyle='--', label='object area (= random)')
        ax.set_title(title, fontsize=10)
        ax.set(xlabel='epoch (seed 0)', ylim=(0, 1))
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path, dpi=110)


# (summary key, guidance key or None, printed digits) of every value a checkpoint gives.
RECOMPUTED = (('knn_top1', None, 1), ('linear_top1', None, 1),
              ('patch_probe_miou', None, 1), ('patch_probe_pixel_miou', None, 1),
              *(('guidance', key, 3) for key in GUIDANCE_KEYS))


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
    summary['patch_probe_settings'] = probe_settings()
    return summary, differences


def class_examples(data_root: str) -> List[str]:
    """The first test image of every class."""
    test = osp.join(data_root, 'objects', 'test')
    return [sorted(glob.glob(osp.join(test, c, '*.png')))[0] for c in sorted(os.listdir(test))]
