"""The README's results figure: what an MST-guided teacher sees, over the k-NN probe curves."""
from itertools import cycle
from typing import Dict, List

import numpy as np

from .mst_pictures import column_titles, draw_rows


def draw_evidence_figure(grid_rows: List[Dict[str, np.ndarray]],
                         knn_probe: Dict[str, List[List[List[float]]]],
                         references: Dict[str, float], max_heads: int = 3,
                         title: str = '', width_inches: float = 8.2, dpi: int = 110):
    """One figure for a README: on top, the :func:`draw_rows` grid (input, attention, guided
    and random mask, reconstruction) of an MST-guided teacher; under it, the k-NN probe's
    top-1 per pretraining epoch, one colour per variant, a thin line per seed, a thick one
    for their mean (when the seeds share their epochs), and the references dashed.

    Args:
        grid_rows (list[dict]): :func:`mst_picture_row` results, one per image.
        knn_probe (dict): Variant -> one ``[[epoch, top1], ...]`` list per seed.
        references (dict): Name -> top-1 (%), e.g. ``{'raw pixels': 40.9}``.
        max_heads (int): Attention heads drawn at most. Defaults to 3.
        title (str): Figure title. Defaults to ''.
        width_inches (float), dpi (int): Size; 8.2 in at 110 dpi is 900 px.

    Returns:
        matplotlib.figure.Figure: Close it with ``plt.close`` when done.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
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
    import matplotlib.pyplot as plt
    fig = draw_evidence_figure(grid_rows, knn_probe, references, max_heads, title)
    fig.savefig(path)
    plt.close(fig)
    return path
