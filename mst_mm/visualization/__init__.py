from .mst_pictures import mst_picture_row, render_rows

__all__ = ['mst_picture_row', 'render_rows']
