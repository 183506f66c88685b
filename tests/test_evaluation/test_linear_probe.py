"""Linear-probe configs: the teacher loads into the frozen backbone; one step trains."""
import copy

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

import mst_mm  # noqa: F401
from tests.conftest import TINY_ARCH, tiny_mst_cfg
from tests.helpers import REPO

CONFIGS = {
    'cls-last': 'configs/benchmarks/classification/linear_deit-s_cls-last_8xb128-100e_in1k.py',
    'dino-4blocks':
        'configs/benchmarks/classification/linear_deit-s_dino-4blocks_8xb128-100e_in1k.py',
}


def one_step(model, optim_cfg, size, num_classes=1000):
    optim_wrapper = build_optim_wrapper(model, optim_cfg)
    data = dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[DataSample().set_gt_label(i % num_classes) for i in range(2)])
    head_before = copy.deepcopy(model.head.state_dict())
    backbone_before = copy.deepcopy(model.backbone.state_dict())
    log_vars = model.train_step(data, optim_wrapper)
    assert torch.isfinite(log_vars['loss'])
    assert any(not torch.equal(v, model.head.state_dict()[k]) for k, v in head_before.items())
    for k, v in backbone_before.items():  # frozen
        torch.testing.assert_close(model.backbone.state_dict()[k], v, msg=k)


@pytest.mark.parametrize('variant', sorted(CONFIGS))
def test_full_size_probe_builds_and_trains_a_step(variant):
    cfg = Config.fromfile(str(REPO / CONFIGS[variant]))
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    expected_in = 384 if variant == 'cls-last' else 4 * 384
    assert model.head.fc.in_features == expected_in
    one_step(model, cfg.optim_wrapper, 224)


@pytest.mark.parametrize('variant', sorted(CONFIGS))
def test_probe_loads_the_mst_teacher_exactly(variant, tmp_path):
    torch.manual_seed(0)
    mst = MODELS.build(tiny_mst_cfg())
    with torch.no_grad():
        for p in mst.teacher.parameters():
            p.normal_()
    ckpt = tmp_path / 'mst.pth'
    torch.save({'state_dict': mst.state_dict()}, ckpt)

    cfg = Config.fromfile(str(REPO / CONFIGS[variant]))
    backbone = cfg.model.backbone
    backbone.update(arch=TINY_ARCH, img_size=32, patch_size=8, frozen_stages=2)
    backbone.init_cfg.checkpoint = str(ckpt)
    if variant == 'dino-4blocks':
        backbone.out_indices = [0, 1]
        cfg.model.head.in_channels = 2 * 32
    else:
        cfg.model.head.in_channels = 32
    cfg.model.head.num_classes = 4
    model = MODELS.build(cfg.model)
    model.init_weights()
    teacher = mst.teacher.module[0].state_dict()
    assert set(model.backbone.state_dict()) == set(teacher)
    for k, v in model.backbone.state_dict().items():
        torch.testing.assert_close(v, teacher[k], msg=k)
    model.train()
    one_step(model, cfg.optim_wrapper, 32, num_classes=4)
