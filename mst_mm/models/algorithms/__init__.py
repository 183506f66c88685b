from .feature_embedder import FeatureEmbedder
from .mst import DINO_MODE, MST

__all__ = ['DINO_MODE', 'FeatureEmbedder', 'MST']
