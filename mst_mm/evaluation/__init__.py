from .knn import DEFAULT_KS, WeightedKNNAccuracy, knn_top1, weighted_knn_scores
from .linear import linear_probe_top1

__all__ = ['DEFAULT_KS', 'WeightedKNNAccuracy', 'knn_top1', 'linear_probe_top1',
           'weighted_knn_scores']
