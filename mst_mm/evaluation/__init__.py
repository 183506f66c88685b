from .guidance import guidance_shares, patch_object_mask
from .knn import DEFAULT_KS, WeightedKNNAccuracy, knn_top1, weighted_knn_scores
from .linear import linear_probe_top1
from .transfer import TRANSFER_METRICS, finetune  # imports mmdet / mmseg only when run

__all__ = ['DEFAULT_KS', 'TRANSFER_METRICS', 'WeightedKNNAccuracy', 'finetune', 'guidance_shares',
           'knn_top1', 'linear_probe_top1', 'patch_object_mask', 'weighted_knn_scores']
