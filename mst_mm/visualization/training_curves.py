"""The curves a DINO practitioner checks first: DINO loss, teacher entropy and KL against ln K."""
import glob
import json
import math
import os
import os.path as osp
from typing import Dict, List, Sequence

CURVE_KEYS = ('loss_dino', 'teacher_entropy', 'teacher_student_kl')
PROBE_PREFIX = 'knn_probe_top1_k'


def read_scalars(work_dir: str, all_runs: bool = False) -> List[dict]:
    """The per-iteration rows that mmengine's ``LocalVisBackend`` wrote for the latest run
    in ``work_dir`` (``<timestamp>/vis_data/scalars.json``), or for every run in it (a
    resumed run writes a folder of its own).

    Args:
        work_dir (str): A Runner's work directory.
        all_runs (bool): Concatenate every run's rows, oldest first. Defaults to False.

    Returns:
        list[dict]: One dict per logged iteration, in order.
    """
    files = sorted(glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json')))
    if not files:
        raise FileNotFoundError(f'No */vis_data/scalars.json under {work_dir}: was the run '
                                'logged with LocalVisBackend (the default)?')
    rows = []
    for path in (files if all_runs else files[-1:]):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def final_values(rows: List[dict], keys: Sequence[str] = CURVE_KEYS,
                 last: int = 1) -> Dict[str, float]:
    """The mean of each key over the last ``last`` logged rows that have it."""
    values = {}
    for key in keys:
        series = [row[key] for row in rows if key in row]
        if series:
            values[key] = sum(series[-last:]) / len(series[-last:])
    return values


def plot_dino_curves(runs: Dict[str, List[List[dict]]], num_prototypes: int,
                     out_file: str, title: str = '') -> str:
    """One figure, three panels: ``loss_dino``, teacher entropy and teacher-student KL
    against the iteration, one colour per variant (one line per seed), ln K drawn in; and
    a fourth with the k-NN probe's top-1 when a run logged it (``KNNProbeHook``).

    Args:
        runs (dict): Variant name -> the :func:`read_scalars` rows of each of its runs.
        num_prototypes (int): K, for the ln K line.
        out_file (str): The PNG to write.
        title (str): Figure title. Defaults to ''.

    Returns:
        str: ``out_file``.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

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
        ax.set_title(labels[key])
        ax.set_xlabel('iteration')
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(out_file)), exist_ok=True)
    fig.savefig(out_file, dpi=110)
    plt.close(fig)
    return out_file
