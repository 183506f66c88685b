"""A test loop for k-NN evaluation: embed the reference set, then classify the test set."""
from typing import Dict, Tuple, Union

import torch
from mmengine.dist import collect_results
from mmengine.runner import TestLoop
from mmpretrain.registry import LOOPS
from torch.utils.data import DataLoader


@LOOPS.register_module()
class KNNTestLoop(TestLoop):
    """mmengine's ``TestLoop`` preceded by one pass over the labelled reference images
    (``train_dataloader``), whose embeddings, gathered from all ranks, go to every metric
    with ``set_reference`` (``WeightedKNNAccuracy``)."""

    def __init__(self, runner, dataloader: Union[DataLoader, Dict], evaluator,
                 train_dataloader: Union[DataLoader, Dict], fp16: bool = False) -> None:
        super().__init__(runner, dataloader, evaluator, fp16)
        self.reference_dataloader = (runner.build_dataloader(train_dataloader, seed=runner.seed)
                                     if isinstance(train_dataloader, dict) else train_dataloader)

    @torch.no_grad()
    def embed_reference(self) -> Tuple[torch.Tensor, torch.Tensor]:
        self.runner.model.eval()
        parts = []
        for data_batch in self.reference_dataloader:
            for sample in self.runner.model.test_step(data_batch):
                parts.append((sample.embedding.cpu(), int(sample.gt_label)))
        parts = collect_results(parts, len(self.reference_dataloader.dataset), device='cpu')
        if parts is None:  # not rank 0: metrics are computed on rank 0 only
            return torch.zeros(0), torch.zeros(0, dtype=torch.long)
        return torch.stack([p[0] for p in parts]), torch.tensor([p[1] for p in parts])

    def run(self) -> dict:
        feats, labels = self.embed_reference()
        for metric in self.evaluator.metrics:
            if hasattr(metric, 'set_reference'):
                metric.set_reference(feats, labels)
        return super().run()
