from .feature_embedder import FeatureEmbedder
from .mst import BACKBONE_PREFIXES, DINO_MODE, MST, NECK_PREFIXES, PRETRAIN_ONLY_KEYS

__all__ = ['BACKBONE_PREFIXES', 'DINO_MODE', 'FeatureEmbedder', 'MST', 'NECK_PREFIXES',
           'PRETRAIN_ONLY_KEYS']
