from .guidance import guidance_shares, patch_object_mask
from .linear import linear_probe_top1
from .knn import DEFAULT_KS, WeightedKNNAccuracy, knn_top1, weighted_knn_scores

__all__ = ['DEFAULT_KS', 'WeightedKNNAccuracy', 'guidance_shares', 'knn_top1', 'linear_probe_top1',
           'patch_object_mask', 'weighted_knn_scores']
