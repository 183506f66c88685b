"""A k-NN probe of the teacher's features during pretraining."""
from typing import Optional, Sequence, Tuple

import torch
from mmengine.dataset import pseudo_collate
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmpretrain.registry import DATASETS, HOOKS
from mmpretrain.utils import get_ori_model

from ...evaluation.knn import knn_top1


@HOOKS.register_module()
class KNNProbeHook(Hook):
    """Log the weighted k-NN top-1 (%) of the teacher's image embedding every few epochs.

    A loss below ln K does not show that the features learn, and DINO and mmpretrain run
    k-NN only after training. Logs ``knn_probe_top1_k{k}`` at the iteration as step; runs on
    the main process only (the other ranks wait at the next gradient all-reduce).

    Args:
        reference_dataloader (dict): Labelled split (``dataset``, ``batch_size``) whose
            pipeline gives single images (``LoadImageFromFile``, ``PackInputs``).
        query_dataloader (dict): The same for the held-out split.
        interval (int): Probe every this many epochs, and after the last.
        ks (Sequence[int]): Neighbour counts.
        temperature (float): Vote temperature.
        weights (str): ``'teacher'`` (the EMA teacher, DINO's practice) or ``'student'``.
        before_training (bool): Also probe the initial weights, the curve's starting point.
    """
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
        reference, reference_labels = self._embed(model, backbone, 'reference')
        query, query_labels = self._embed(model, backbone, 'query')
        top1 = knn_top1(reference, reference_labels, query, query_labels, ks=self.ks,
                        temperature=self.temperature)
        scalars = {f'knn_probe_top1_k{k}': acc for k, acc in top1.items()}
        runner.visualizer.add_scalars(scalars, step=runner.iter)
        runner.logger.info(f'k-NN probe ({self.weights}, after {epochs_done} epochs): ' + ', '.join(
            f'top-1 {acc:.2f} % (k = {k})' for k, acc in top1.items()))

    @torch.no_grad()
    def _embed(self, model, backbone, split: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Image embeddings and labels of one split, normalised as in training."""
        if self._datasets is None:
            self._datasets = {name: DATASETS.build(cfg['dataset'])
                              for name, cfg in self.loaders.items()}
        loader = torch.utils.data.DataLoader(
            self._datasets[split], batch_size=self.loaders[split].get('batch_size', 256),
            shuffle=False, num_workers=0, collate_fn=pseudo_collate)
        preprocessor = model.data_preprocessor
        mean, std = preprocessor.mean.reshape(1, -1, 1, 1), preprocessor.std.reshape(1, -1, 1, 1)
        was_training = backbone.training
        backbone.eval()
        feats, labels = [], []
        for batch in loader:
            images = torch.stack(batch['inputs']).to(mean.device).float()
            if getattr(preprocessor, '_channel_conversion', False):
                images = images[:, [2, 1, 0]]  # BGR as loaded -> RGB as trained
            feats.append(backbone.forward_mst((images - mean) / std).global_feat.cpu())
            labels += [int(sample.gt_label) for sample in batch['data_samples']]
        backbone.train(was_training)
        return torch.cat(feats), torch.tensor(labels)
