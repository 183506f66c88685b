"""A k-NN probe of the teacher's features during pretraining."""
from typing import Optional, Sequence, Tuple

import torch
from mmengine.dataset import pseudo_collate
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmpretrain.registry import DATASETS, HOOKS, METRICS
from mmpretrain.utils import get_ori_model

from ...models.algorithms.feature_embedder import embed_images


@HOOKS.register_module()
class KNNProbeHook(Hook):
    """Log ``knn_probe_top1_k{k}``, the weighted k-NN top-1 (%) of the teacher's (or student's)
    embedding, every ``interval`` epochs and after the last: a loss below ln K does not show that
    the features learn, and DINO and mmpretrain run k-NN only after training. The dataloaders
    are labelled splits (``dataset``, ``batch_size``) of single images. Main process only (the
    other ranks wait at the next gradient all-reduce)."""
    priority = 'LOW'

    def __init__(self, reference_dataloader: dict, query_dataloader: dict, interval: int = 1,
                 ks: Sequence[int] = (20, ), temperature: float = 0.07,
                 weights: str = 'teacher', before_training: bool = True) -> None:
        if weights not in ('teacher', 'student'):
            raise ValueError(f"weights must be 'teacher' or 'student', got {weights!r}.")
        if interval < 1:
            raise ValueError(f'interval must be >= 1 epoch, got {interval}.')
        self.loaders = dict(reference=reference_dataloader, query=query_dataloader)
        self.interval, self.ks, self.temperature = interval, tuple(ks), temperature
        self.weights, self.before_training = weights, before_training
        self._datasets: Optional[dict] = None

    def before_train(self, runner) -> None:
        if self.before_training and runner.iter == 0:
            self.probe(runner, epochs_done=0)

    def after_train_epoch(self, runner) -> None:
        if self.every_n_epochs(runner, self.interval) or self.is_last_train_epoch(runner):
            self.probe(runner, epochs_done=runner.epoch + 1)

    def probe(self, runner, epochs_done: int) -> None:
        if not is_main_process():
            return
        model = get_ori_model(runner.model)
        backbone = model.teacher.module[0] if self.weights == 'teacher' else model.backbone
        # From the registry: the metric's package sits above engine/, which never imports it.
        metric = METRICS.build(dict(type='WeightedKNNAccuracy', ks=self.ks,
                                    temperature=self.temperature))
        metric.set_reference(*self._embed(model, backbone, 'reference'))
        query, query_labels = self._embed(model, backbone, 'query')
        top1 = metric.compute_metrics(list(zip(query, query_labels.tolist())))  # top1_k{k}
        runner.visualizer.add_scalars({f'knn_probe_{name}': acc for name, acc in top1.items()},
                                      step=runner.iter)
        runner.logger.info(f'k-NN probe ({self.weights}, after {epochs_done} epochs): ' + ', '.join(
            f'top-1 {top1[f"top1_k{k}"]:.2f} % (k = {k})' for k in self.ks))

    def _embed(self, model, backbone, split: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Image embeddings and labels of one split, normalised as in training."""
        if self._datasets is None:
            self._datasets = {name: DATASETS.build(cfg['dataset'])
                              for name, cfg in self.loaders.items()}
        batches = list(torch.utils.data.DataLoader(
            self._datasets[split], batch_size=self.loaders[split].get('batch_size', 256),
            shuffle=False, num_workers=0, collate_fn=pseudo_collate))
        preprocessor = model.data_preprocessor
        feats, _ = embed_images(  # BGR as loaded -> RGB as trained, where training flips
            backbone, (torch.stack(batch['inputs']) for batch in batches), preprocessor.mean,
            preprocessor.std, bgr_to_rgb=getattr(preprocessor, '_channel_conversion', False))
        labels = [int(sample.gt_label) for batch in batches for sample in batch['data_samples']]
        return feats, torch.tensor(labels)
