"""A test loop for k-NN evaluation: embed the reference set, then classify the test set."""
from typing import Tuple

import torch
from mmengine.dist import collect_results
from mmengine.runner import TestLoop
from mmpretrain.registry import LOOPS


@LOOPS.register_module()
class KNNTestLoop(TestLoop):
    """``TestLoop`` that first embeds ``train_dataloader`` for each metric's ``set_reference``."""

    def __init__(self, runner, dataloader, evaluator, train_dataloader, fp16: bool = False) -> None:
        super().__init__(runner, dataloader, evaluator, fp16)
        self.reference_dataloader = (runner.build_dataloader(train_dataloader, seed=runner.seed)
                                     if isinstance(train_dataloader, dict) else train_dataloader)

    @torch.no_grad()
    def embed_reference(self) -> Tuple[torch.Tensor, torch.Tensor]:
        self.runner.model.eval()
        parts = [(s.embedding.cpu(), int(s.gt_label)) for batch in self.reference_dataloader
                 for s in self.runner.model.test_step(batch)]
        parts = collect_results(parts, len(self.reference_dataloader.dataset), device='cpu')
        if parts is None:  # not rank 0: metrics are computed on rank 0 only
            return torch.zeros(0), torch.zeros(0, dtype=torch.long)
        return torch.stack([p[0] for p in parts]), torch.tensor([p[1] for p in parts])

    def run(self) -> dict:
        feats, labels = self.embed_reference()
        for metric in filter(lambda m: hasattr(m, 'set_reference'), self.evaluator.metrics):
            metric.set_reference(feats, labels)
        return super().run()
