"""Every config builds; the full DeiT-S recipe runs one real training step on CPU."""

import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import default_collate
from mmengine.logging import MessageHub
from mmengine.optim import build_optim_wrapper
from mmpretrain.registry import DATASETS, MODELS

import mst_mm  # noqa: F401
from tests.helpers import REPO, make_image_folder

# The mmdet / mmseg fine-tuning configs have their own scopes (tests/test_downstream.py).
DOWNSTREAM = ('mmdetection', 'mmsegmentation')
PRETRAIN_CONFIGS = sorted(
    str(p.relative_to(REPO)) for p in (REPO / 'configs').rglob('*.py')
    if '_base_' not in p.parts and not set(DOWNSTREAM) & set(p.parts))


@pytest.mark.parametrize('config', PRETRAIN_CONFIGS)
def test_config_loads_and_names_registered_modules(config):
    cfg = Config.fromfile(str(REPO / config))
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.custom_imports.imports == ['mst_mm']
    assert MODELS.get(cfg.model.type) is not None


def test_ablations_change_only_what_they_say():
    base = Config.fromfile(str(REPO / 'configs/mst_deit-s_100e.py'))
    ablations = REPO / 'configs/ablations'
    random = Config.fromfile(str(ablations / 'mst_deit-s_100e_mask-random.py'))
    assert random.model.mask_cfg == dict(num=8, p=0.1, mode='random')
    dino = Config.fromfile(str(ablations / 'dino_deit-s_100e.py'))
    assert dino.model.decoder_head is None and dino.model.mask_cfg.mode == 'none'
    assert dino.model.neck.with_bn is False   # DINO's head: no BN
    dino_bn = Config.fromfile(str(ablations / 'dino_deit-s_100e_neck-bn.py'))
    assert dino_bn.model.neck == {**dino.model.neck, 'with_bn': True, 'bn_statistics': 'all_crops'}
    assert base.model.neck.bn_statistics == 'global_crops' and base.model.neck.with_bn
    no_bn = Config.fromfile(str(ablations / 'mst_deit-s_100e_neck-no-bn.py'))
    assert no_bn.model.neck.with_bn is False
    assert random.optim_wrapper == base.optim_wrapper
    assert base.train_cfg.max_epochs == 100 and base.param_scheduler[1].end == 100
    swin = Config.fromfile(str(REPO / 'configs/mst_swin-t_100e.py'))
    similarity = Config.fromfile(str(ablations / 'mst_swin-t_100e_guidance-similarity.py'))
    assert swin.model.backbone.guidance == 'pooled_query'
    assert similarity.model.backbone == {**swin.model.backbone, 'guidance': 'pooled_similarity'}
    swin_random = Config.fromfile(str(ablations / 'mst_swin-t_100e_mask-random.py'))
    assert swin_random.model.mask_cfg.mode == 'random'
    assert swin_random.model.backbone == swin.model.backbone


@pytest.mark.parametrize('config, backbone_params', [('configs/mst_deit-s_300e.py', 21.7e6),
                                                     ('configs/mst_swin-t_100e.py', 27.5e6)])
def test_full_recipe_runs_one_step_at_batch_two(config, backbone_params, tmp_path):
    cfg = Config.fromfile(str(REPO / config))
    assert cfg.train_dataloader.batch_size * 8 == 1024
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    assert sum(p.numel() for p in model.backbone.parameters()) == pytest.approx(backbone_params,
                                                                                rel=0.01)

    data_root = make_image_folder(tmp_path / 'data', classes=1, per_class=2, size=(256, 320))
    dataset_cfg = dict(type='CustomDataset', data_root=data_root,
                       pipeline=cfg.train_dataloader.dataset.pipeline)
    dataset = DATASETS.build(dataset_cfg)
    batch = default_collate([dataset[0], dataset[1]])
    shapes = [tuple(v.shape) for v in batch['inputs']]
    assert shapes == [(2, 3, 224, 224)] * 2 + [(2, 3, 96, 96)] * 8

    MessageHub.get_current_instance().update_info('max_iters', 1000)
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    first_weight = model.backbone.patch_embed.projection.weight
    before = first_weight.detach().clone()
    model.train_step(batch, optim_wrapper)   # step 0: teacher := student
    log_vars = model.train_step(batch, optim_wrapper)
    assert set(log_vars) == {'loss', 'loss_dino', 'loss_restore', 'teacher_entropy',
                             'teacher_student_kl', 'prototypes_in_use'}
    assert all(torch.isfinite(torch.as_tensor(v)) for v in log_vars.values())
    assert not torch.equal(before, first_weight)
    assert model.head.center.abs().sum() > 0
