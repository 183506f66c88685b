from .mst_pictures import mst_picture_row, render_rows
from .training_curves import CURVE_KEYS, final_values, plot_dino_curves, read_scalars

__all__ = ['CURVE_KEYS', 'final_values', 'mst_picture_row', 'plot_dino_curves', 'read_scalars',
           'render_rows']
