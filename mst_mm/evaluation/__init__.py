from ..models.algorithms.feature_embedder import embed_patches
from .knn import DEFAULT_KS, WeightedKNNAccuracy, knn_top1, weighted_knn_scores

__all__ = ['DEFAULT_KS', 'WeightedKNNAccuracy', 'embed_patches', 'knn_top1',
           'weighted_knn_scores']
