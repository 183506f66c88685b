"""A hook for tests/test_cuda.py: what a training run did on its device, written to the work
dir as ``device_probe_rank{r}.json`` for the test to read after ``tools/train.py`` or
``tools/dist_train.sh`` has exited.

Registered in mmengine's root registry, so that mmpretrain, mmdet and mmseg runners all find
it (``custom_imports`` names this module).
"""
import json
import os.path as osp

import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmpretrain.utils import get_ori_model
from torch.nn.modules.batchnorm import _BatchNorm


def _devices(tensors) -> list:
    return sorted({str(t.device) for t in tensors})


def _checksum(module: nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))


@HOOKS.register_module()
class DeviceProbeHook(Hook):
    """Records, per iteration, the losses, the AMP loss scaler, the dtype that autocast gave
    the student's last linear layer, the mask's device and whether the student moved; for MST
    models also the teacher, the centre all-reduce and the neck's BN statistics per call.

    Args:
        mst (bool): The model is MST (teacher, centre, neck spies). False for mmdet/mmseg.
    """

    def __init__(self, mst: bool = True) -> None:
        self.mst = mst
        self.iters, self.neck_calls, self.center_reduces = [], [], []
        self.linear_dtypes = []

    def before_train(self, runner) -> None:
        model = get_ori_model(runner.model)
        linears = [m for m in model.backbone.modules() if isinstance(m, nn.Linear)]
        if linears:
            linears[-1].register_forward_hook(
                lambda module, args, out: self.linear_dtypes.append(str(out.dtype)))
        if not self.mst:
            return
        self._spy_mask(model)
        self._spy_neck(model.neck)
        self._spy_center_all_reduce()

    def _spy_mask(self, model) -> None:
        original = model._mask

        def recording(feats):
            mask = original(feats)
            # What MST._mask computes the mask from: the teacher's CLS attention, or without
            # it (random and no mask) the CLS feature that sizes the zeros. The teacher runs
            # with with_patches=False, so feats.feat_map is None here.
            source = feats.attn if feats.attn is not None else feats.global_feat
            self.mask = dict(device=str(mask.device), dtype=str(mask.dtype),
                             source='attn' if feats.attn is not None else 'global_feat',
                             source_device=str(source.device))
            return mask

        model._mask = recording

    def _spy_neck(self, neck: nn.Module) -> None:
        # The student's neck runs its MLP once per group of crops (DINONeck.forward_crops:
        # the global crops with BN statistics updated, the local ones frozen), or once for
        # all crops (forward); _mlp is where both paths pass, with the flag.
        norms = [m for m in neck.modules() if isinstance(m, _BatchNorm)]
        original = neck._mlp

        def recording(x, update_bn_stats=True):
            before = [n.running_mean.clone() for n in norms]
            out = original(x, update_bn_stats=update_bn_stats)
            self.neck_calls.append(dict(
                batch=x.shape[0], update_bn_stats=update_bn_stats,
                stats_changed=any(not torch.equal(b, n.running_mean)
                                  for b, n in zip(before, norms))))
            return out

        neck._mlp = recording

    def _spy_center_all_reduce(self) -> None:
        from mst_mm.models.heads import dino_head
        original = dino_head.all_reduce

        def recording(data, *args, **kwargs):
            self.center_reduces.append(dict(device=str(data.device), dtype=str(data.dtype)))
            return original(data, *args, **kwargs)

        dino_head.all_reduce = recording
        # A module global outlives the run: after_train puts it back, so that a run inside a
        # test process (tests/test_gpu_probe_hooks.py) leaves no spy behind.
        self._restore_all_reduce = lambda: setattr(dino_head, 'all_reduce', original)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.student_before = _checksum(get_ori_model(runner.model).backbone)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        model = get_ori_model(runner.model)
        record = dict(iter=runner.iter,
                      losses={k: float(torch.as_tensor(v).detach()) for k, v in outputs.items()
                              if 'loss' in k},
                      student_moved=_checksum(model.backbone) != self.student_before)
        wrapper = runner.optim_wrapper
        scaler = getattr(wrapper, 'loss_scaler', None)
        record['optim_wrapper'] = type(wrapper).__name__
        record['cast_dtype'] = str(getattr(wrapper, 'cast_dtype', None))
        if scaler is not None:
            record['scaler'] = dict(type=type(scaler).__name__, enabled=scaler.is_enabled(),
                                    scale=float(scaler.get_scale()))
        if self.mst:
            record['mask'] = getattr(self, 'mask', None)
            if runner.iter == 0:
                self.teacher_after_first = {k: v.detach().clone()
                                            for k, v in model.teacher.avg_parameters.items()}
        self.iters.append(record)

    def after_train(self, runner) -> None:
        wrapped = runner.model
        model = get_ori_model(wrapped)
        summary = dict(
            iters=self.iters, linear_dtypes=sorted(set(self.linear_dtypes)),
            wrapper=type(wrapped).__name__,
            param_devices=_devices(model.parameters()),
            buffer_devices=_devices(model.buffers()),
        )
        # A process group another test left open does not make this run distributed.
        if wrapped is not model and torch.distributed.is_initialized():
            summary.update(backend=torch.distributed.get_backend(),
                           world_size=torch.distributed.get_world_size(),
                           find_unused_parameters=wrapped.find_unused_parameters)
        if self.mst:
            final = model.teacher.avg_parameters
            moved = [k for k, v in self.teacher_after_first.items()
                     if not torch.equal(v, final[k])]
            norm_types = {part: sorted({type(m).__name__ for m in getattr(model, part).modules()
                                        if isinstance(m, _BatchNorm)})
                          for part in ('neck', 'decoder_head') if getattr(model, part, None)}
            summary.update(
                teacher_moved=len(moved), teacher_tensors=len(final),
                teacher_devices=_devices(final.values()),
                center=model.head.center.flatten()[:8].tolist(),
                center_device=str(model.head.center.device),
                center_reduces=self.center_reduces, neck_calls=self.neck_calls,
                norm_types=norm_types)
        if getattr(self, '_restore_all_reduce', None) is not None:
            self._restore_all_reduce()
        path = osp.join(runner.work_dir, f'device_probe_rank{get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(summary, f, indent=1)
