from .mst import MST

__all__ = ['MST']
