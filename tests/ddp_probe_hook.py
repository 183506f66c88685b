"""Hooks for tests/test_engine/test_distributed.py: each rank dumps what must agree across ranks
and what
its random streams drew."""
import os.path as osp

import numpy as np
import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


@HOOKS.register_module()
class DDPProbeHook(Hook):
    """Dumps what must agree across ranks, and the projection's last layer at the start and
    at the end of every epoch (frozen in epoch 1 by FreezeLastLayerHook)."""

    def before_train(self, runner) -> None:
        self.last_layer = [self._last_layer(runner)]

    def after_train_epoch(self, runner) -> None:
        self.last_layer.append(self._last_layer(runner))

    @staticmethod
    def _last_layer(runner) -> torch.Tensor:
        layer = get_ori_model(runner.model).neck.last_layer
        return torch.cat([p.detach().flatten() for p in layer.parameters()])

    def after_train(self, runner) -> None:
        wrapped = runner.model
        model = get_ori_model(wrapped)
        torch.save(dict(
            wrapper=type(wrapped).__name__,
            world_size=torch.distributed.get_world_size(),
            sync_bn=sum('SyncBatchNorm' in type(m).__name__ for m in model.modules()),
            plain_bn=sum(type(m) in (nn.BatchNorm1d, nn.BatchNorm2d) for m in model.modules()),
            center=model.head.center.clone(),
            teacher={k: v.clone() for k, v in model.teacher.state_dict().items()},
            student={k: v.detach().clone() for k, v in model.backbone.state_dict().items()},
            last_layer=torch.stack(self.last_layer),
            find_unused_parameters=wrapped.find_unused_parameters,
        ), osp.join(runner.work_dir, f'probe_rank{get_rank()}.pth'))


@HOOKS.register_module()
class RandomnessProbeHook(Hook):
    """Dumps the first iteration's crops, the student's masks and the main process's torch and
    numpy generator states to ``randomness_rank{r}.pth``."""

    def before_train(self, runner) -> None:
        backbone = get_ori_model(runner.model).backbone
        forward_mst = backbone.forward_mst
        self.masks = []

        def recording(x, mask=None, **kwargs):
            if mask is not None and runner.iter == 0:
                self.masks.append(mask.clone())
            return forward_mst(x, mask=mask, **kwargs)

        backbone.forward_mst = recording  # the student's only; the teacher is another copy

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.iter == 0:
            self.states = dict(torch=torch.get_rng_state(),
                               numpy=torch.from_numpy(np.random.get_state()[1].copy()))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.iter == 0:
            torch.save(dict(crops=[view.clone() for view in data_batch['inputs']],
                            masks=self.masks, **self.states),
                       osp.join(runner.work_dir, f'randomness_rank{get_rank()}.pth'))
