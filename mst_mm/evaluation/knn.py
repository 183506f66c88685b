"""Weighted k-NN classification of frozen features (paper appendix "k-NN classification").

Memory stays bounded by one chunk: queries and the stored train features are both walked in
chunks, and only the running top-k neighbours of each query are kept. DINO's script holds a
(queries x all train images) similarity block at once, a known out-of-memory complaint.
"""
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric
from mmpretrain.registry import METRICS

DEFAULT_KS = (10, 20, 100, 200)


@torch.no_grad()
def weighted_knn_scores(train_feats: torch.Tensor,
                        train_labels: torch.Tensor,
                        query_feats: torch.Tensor,
                        num_classes: int,
                        ks: Sequence[int] = DEFAULT_KS,
                        temperature: float = 0.07,
                        chunk_size: int = 4096) -> Dict[int, torch.Tensor]:
    r"""Class votes (M, num_classes) of the k nearest of N train features, per k in ``ks``.

    Features are L2-normalised and compared by cosine similarity :math:`s`; each of the k
    nearest neighbours votes for its class with weight :math:`\exp(s / T)` (Wu et al. 2018,
    as in DINO and the MST appendix). k is capped at N; ``chunk_size`` rows of train and
    query features are compared at a time.
    """
    if len(train_feats) != len(train_labels):
        raise ValueError(f'{len(train_feats)} train features but {len(train_labels)} labels.')
    if len(train_feats) == 0:
        raise ValueError('k-NN needs at least one train feature.')
    max_k = min(max(ks), len(train_feats))
    train_labels = train_labels.long()
    votes = {k: [] for k in ks}
    for q_start in range(0, len(query_feats), chunk_size):
        query = F.normalize(query_feats[q_start:q_start + chunk_size].float(), dim=1)
        top_sim = query.new_full((len(query), 0), float('-inf'))
        top_idx = torch.zeros((len(query), 0), dtype=torch.long, device=query.device)
        for t_start in range(0, len(train_feats), chunk_size):
            train = F.normalize(train_feats[t_start:t_start + chunk_size].float(), dim=1)
            sim = query @ train.to(query.device).t()
            idx = torch.arange(t_start, t_start + len(train), device=query.device)
            top_sim = torch.cat([top_sim, sim], dim=1)
            top_idx = torch.cat([top_idx, idx.expand(len(query), -1)], dim=1)
            keep = top_sim.topk(min(max_k, top_sim.shape[1]), dim=1)
            top_sim, top_idx = keep.values, top_idx.gather(1, keep.indices)
        neighbour_labels = train_labels.to(query.device)[top_idx]
        weights = (top_sim / temperature).exp()
        for k in ks:
            kk = min(k, max_k)
            chunk_votes = query.new_zeros(len(query), num_classes)
            chunk_votes.scatter_add_(1, neighbour_labels[:, :kk], weights[:, :kk])
            votes[k].append(chunk_votes)
    return {k: torch.cat(v) for k, v in votes.items()}


def knn_top1(train_feats: torch.Tensor,
             train_labels: torch.Tensor,
             query_feats: torch.Tensor,
             query_labels: torch.Tensor,
             num_classes: Optional[int] = None,
             ks: Sequence[int] = DEFAULT_KS,
             temperature: float = 0.07,
             chunk_size: int = 4096) -> Dict[int, float]:
    """Top-1 accuracy in percent of weighted k-NN for each k."""
    if num_classes is None:
        num_classes = int(max(train_labels.max(), query_labels.max())) + 1
    votes = weighted_knn_scores(train_feats, train_labels, query_feats, num_classes, ks,
                                temperature, chunk_size)
    return {k: float((v.argmax(1).cpu() == query_labels.cpu()).float().mean() * 100)
            for k, v in votes.items()}


@METRICS.register_module()
class WeightedKNNAccuracy(BaseMetric):
    """Top-1 (%) of weighted k-NN on frozen embeddings, for mmengine's test loop.

    ``KNNTestLoop`` embeds the reference (train) set first and hands it over with
    :meth:`set_reference`; predictions carry an ``embedding`` field (``FeatureEmbedder``).
    """
    default_prefix = 'knn'

    def __init__(self,
                 ks: Sequence[int] = DEFAULT_KS,
                 temperature: float = 0.07,
                 chunk_size: int = 4096,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.ks, self.temperature, self.chunk_size = tuple(ks), temperature, chunk_size
        self.reference: Optional[tuple] = None

    def set_reference(self, feats: torch.Tensor, labels: torch.Tensor) -> None:
        self.reference = (feats, labels)

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            self.results.append((sample['embedding'].cpu(), int(sample['gt_label'])))

    def compute_metrics(self, results: list) -> Dict[str, float]:
        if self.reference is None:
            raise RuntimeError('WeightedKNNAccuracy has no reference features: run it with '
                               "test_cfg=dict(type='KNNTestLoop', train_dataloader=...).")
        feats = torch.stack([r[0] for r in results])
        labels = torch.tensor([r[1] for r in results])
        train_feats, train_labels = self.reference
        num_classes = int(max(train_labels.max(), labels.max())) + 1
        top1 = knn_top1(train_feats, train_labels, feats, labels, num_classes, self.ks,
                        self.temperature, self.chunk_size)
        return {f'top1_k{k}': acc for k, acc in top1.items()}
