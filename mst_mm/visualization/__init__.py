from .evidence_figure import draw_evidence_figure, plot_evidence_figure
from .mst_pictures import draw_rows, mst_picture_row, render_rows, upsample_patches
from .training_curves import CURVE_KEYS, final_values, plot_dino_curves, read_scalars

__all__ = ['CURVE_KEYS', 'draw_evidence_figure', 'draw_rows', 'final_values',
           'mst_picture_row', 'plot_dino_curves', 'plot_evidence_figure', 'read_scalars',
           'render_rows', 'upsample_patches']
