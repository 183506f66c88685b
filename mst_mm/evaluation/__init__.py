from .knn import DEFAULT_KS, WeightedKNNAccuracy, knn_top1, weighted_knn_scores

__all__ = ['DEFAULT_KS', 'WeightedKNNAccuracy', 'knn_top1', 'weighted_knn_scores']
