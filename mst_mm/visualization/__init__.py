from .evidence_figure import draw_evidence_figure, plot_evidence_figure
from .mst_pictures import draw_rows, load_image, mst_picture_row, render_rows, upsample_patches
from .multicrop_views import default_zoom, multicrop_views, views_grid
from .training_curves import CURVE_KEYS, final_values, plot_dino_curves, read_scalars

__all__ = ['CURVE_KEYS', 'default_zoom', 'draw_evidence_figure', 'draw_rows', 'final_values',
           'load_image', 'mst_picture_row', 'multicrop_views', 'plot_dino_curves',
           'plot_evidence_figure', 'read_scalars', 'render_rows', 'upsample_patches',
           'views_grid']
