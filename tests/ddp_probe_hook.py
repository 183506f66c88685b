"""A hook for tests/test_distributed.py: each rank dumps what must agree across ranks."""
import os.path as osp

import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class DDPProbeHook(Hook):

    def after_train(self, runner) -> None:
        wrapped = runner.model
        model = wrapped.module if is_model_wrapper(wrapped) else wrapped
        torch.save(dict(
            wrapper=type(wrapped).__name__,
            world_size=torch.distributed.get_world_size(),
            sync_bn=sum('SyncBatchNorm' in type(m).__name__ for m in model.modules()),
            plain_bn=sum(type(m) in (nn.BatchNorm1d, nn.BatchNorm2d) for m in model.modules()),
            center=model.head.center.clone(),
            teacher={k: v.clone() for k, v in model.teacher.state_dict().items()},
            student={k: v.detach().clone() for k, v in model.backbone.state_dict().items()},
        ), osp.join(runner.work_dir, f'probe_rank{get_rank()}.pth'))
