from ..models.algorithms.feature_embedder import embed_patches
from .knn import DEFAULT_KS, WeightedKNNAccuracy, knn_top1, weighted_knn_scores
from .linear import linear_probe_top1
from .patch_probe import patch_probe_miou, pixel_patches

__all__ = ['DEFAULT_KS', 'WeightedKNNAccuracy', 'embed_patches', 'knn_top1',
           'linear_probe_top1', 'patch_probe_miou', 'pixel_patches', 'weighted_knn_scores']
