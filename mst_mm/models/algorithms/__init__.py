from .feature_embedder import FeatureEmbedder
from .mst import MST

__all__ = ['FeatureEmbedder', 'MST']
