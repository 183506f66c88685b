"""The README's evidence figure (mst_research.report): the picture grid of mst_mm's
visualisation over the k-NN probe curves, one colour per variant, a line per seed."""
import numpy as np
import pytest
import torch
from kit_helpers import demo_model

from mst_mm.visualization import mst_picture_row
from mst_research.report import draw_evidence_figure, plot_evidence_figure


def _probe(epochs_per_seed):
    """Two variants, one [[epoch, top1], ...] list per seed."""
    return {variant: [[[e, base + 2.0 * e + seed] for e in epochs]
                      for seed, epochs in enumerate(epochs_per_seed)]
            for variant, base in (('dino', 30.0), ('mst_guided_mask', 32.0))}


REFERENCES = {'raw pixels': 40.9, 'random init': 21.1}


def test_evidence_figure_draws_the_grid_over_the_probe_curves(tmp_path):
    import matplotlib.pyplot as plt
    from PIL import Image

    model = demo_model()
    rows = [mst_picture_row(model, torch.randn(3, 32, 32), torch.Generator().manual_seed(s),
                            label=name) for s, name in enumerate(['bear', 'cat'])]
    open_figures = plt.get_fignums()
    path = plot_evidence_figure(rows, _probe([[1, 2, 3], [1, 2, 3]]), REFERENCES,
                                str(tmp_path / 'evidence.png'), max_heads=2, title='MST')
    assert path == str(tmp_path / 'evidence.png') and plt.get_fignums() == open_figures
    width, height = Image.open(path).size
    assert 850 <= width <= 950 and 500 <= height <= 1000   # README width, grid + curves

    fig = draw_evidence_figure(rows, _probe([[1, 2, 3], [1, 2, 3]]), REFERENCES, max_heads=2)
    try:
        grid = [ax for ax in fig.axes if ax.get_title() == 'input']
        curves, = [ax for ax in fig.axes if ax.get_xlabel() == 'pretraining epoch']
        assert len(grid) == 1 and grid[0].get_ylabel() == 'bear'
        # 2 variants x 2 seeds (thin), 2 means (thick), 2 references (dashed).
        assert len(curves.lines) == 8
        thick = [line for line in curves.lines if line.get_linewidth() > 2]
        np.testing.assert_allclose(thick[0].get_ydata(), [32.5, 34.5, 36.5])  # dino mean
        assert [t.get_text() for t in curves.get_legend().get_texts()] == [
            'dino (2 seeds), mean', 'mst_guided_mask (2 seeds), mean', 'raw pixels (40.9)',
            'random init (21.1)']
        assert [line.get_ydata()[0] for line in curves.lines[-2:]] == [40.9, 21.1]
    finally:
        plt.close(fig)


def _synthetic_row(seed=0):
    rng = np.random.RandomState(seed)
    attn_heads = rng.dirichlet(np.ones(16), size=2).reshape(2, 4, 4).astype(np.float32)
    return dict(image=rng.randint(0, 256, (16, 16, 3), dtype=np.uint8),
                attn=attn_heads.mean(0), attn_heads=attn_heads,
                candidates=rng.rand(4, 4) < 0.5, guided_mask=np.eye(4, dtype=bool),
                random_mask=np.eye(4, dtype=bool)[::-1], num=2, p=0.5)


def test_evidence_figure_draws_no_mean_over_seeds_probed_at_different_epochs():
    import matplotlib.pyplot as plt

    fig = draw_evidence_figure([_synthetic_row()], _probe([[1, 2, 3], [2, 4]]), REFERENCES)
    try:
        curves, = [ax for ax in fig.axes if ax.get_xlabel() == 'pretraining epoch']
        assert len(curves.lines) == 4 + 2 and all(
            line.get_linewidth() < 2 for line in curves.lines)
        assert [t.get_text() for t in curves.get_legend().get_texts()][:2] == [
            'dino (2 seeds)', 'mst_guided_mask (2 seeds)']
    finally:
        plt.close(fig)


@pytest.mark.parametrize('rows, probe, message', [
    ([], _probe([[1]]), 'No grid rows'),
    ([_synthetic_row()], {}, 'knn_probe is empty'),
    ([_synthetic_row()], {'dino': [[[1, 30.0]]], 'mst_decoder': []},
     r"knn_probe\['mst_decoder'\] has no seeds"),
    ([_synthetic_row()], {'dino': [[[1, 30.0]], []]}, r"knn_probe\['dino'\] has no seeds or a "
                                                      'seed without points'),
])
def test_evidence_figure_names_what_is_missing(tmp_path, rows, probe, message):
    import matplotlib.pyplot as plt

    open_figures = plt.get_fignums()
    with pytest.raises(ValueError, match=message):
        plot_evidence_figure(rows, probe, REFERENCES, str(tmp_path / 'x.png'))
    assert plt.get_fignums() == open_figures and not (tmp_path / 'x.png').exists()
