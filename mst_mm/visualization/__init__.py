from .mst_pictures import draw_rows, load_image, mst_picture_row, render_rows, upsample_patches
from .multicrop_views import default_zoom, multicrop_views, views_grid

__all__ = ['default_zoom', 'draw_rows', 'load_image', 'mst_picture_row', 'multicrop_views',
           'render_rows', 'upsample_patches', 'views_grid']
