"""One MST checkpoint into mmdet Mask R-CNN (Swin-T) and mmseg SETR (DeiT-S).

The MST models are the real Swin-T and DeiT-S configs (with a small projection head, which
the converter drops anyway); the downstream models are built from our benchmark configs
with the data roots pointed at tiny generated COCO / Cityscapes sets and smaller images.
"""
import copy
import json
import os
from typing import Tuple

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS as PRETRAIN_MODELS

import mst_mm  # noqa: F401
from mst_mm.errors import CheckpointError
from tests.downstream_data import make_tiny_cityscapes, make_tiny_coco
from tests.helpers import REPO, load_tool, scalars

DET_CONFIG = REPO / 'configs/benchmarks/mmdetection/mask-rcnn_mst-swin-t-p4-w7_fpn_1x_coco.py'
SEG_CONFIG = (REPO / 'configs/benchmarks/mmsegmentation/'
              'setr_mst-deit-s_naive_8xb1-40k_cityscapes-768x768.py')
converter = load_tool('tools/model_converters/mst2downstream.py')


@pytest.fixture(autouse=True)
def restore_default_scope():
    """A Runner makes mmdet's or mmseg's scope the current one; later tests expect ours."""
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def save_mst_checkpoint(config: str, path) -> torch.nn.Module:
    """Build an MST model from `config`, give its teacher weights of its own, save the two
    entries of an mmengine checkpoint that the converter reads (meta, state_dict), and
    return the model. (That a full Runner checkpoint loads weights-only is test_resume's.)"""
    cfg = Config.fromfile(str(REPO / config))
    cfg.model.neck.out_channels = cfg.model.head.out_channels = 256
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # a Runner may have set mmdet's
        model = PRETRAIN_MODELS.build(cfg.model)
    model.init_weights()
    with torch.no_grad():
        for param in model.teacher.module.parameters():
            param.add_(torch.randn_like(param) * 1e-2)
    torch.save(dict(meta=dict(epoch=100, iter=12345), state_dict=model.state_dict()), path)
    return model.eval()


@pytest.fixture(scope='module')
def swin_mst(tmp_path_factory):
    path = tmp_path_factory.mktemp('swin') / 'epoch_100.pth'
    config = 'configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py'
    return save_mst_checkpoint(config, path), str(path)


@pytest.fixture(scope='module')
def deit_mst(tmp_path_factory):
    path = tmp_path_factory.mktemp('deit') / 'epoch_100.pth'
    config = 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'
    return save_mst_checkpoint(config, path), str(path)


def pretrained_backbone(model_cfg, registry):
    """Build the downstream model and run its init_weights (which loads the checkpoint)."""
    model = registry.build(copy.deepcopy(model_cfg))
    model.init_weights()
    model.eval()  # mmdet's Swin.train() returns None, so no chaining
    return model.backbone


def assert_loads_exactly(backbone, converted):
    """Zero missing, zero unexpected, and every tensor arrived (mmdet/mmseg use strict=False)."""
    fresh = copy.deepcopy(backbone)
    result = fresh.load_state_dict(converted, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == []
    state = backbone.state_dict()
    for key, value in converted.items():
        assert torch.equal(state[key], value), key


def test_swin_teacher_into_mmdet_backbone_keys_and_outputs_match(swin_mst, tmp_path):
    from mmdet.registry import MODELS
    model, checkpoint = swin_mst
    out = tmp_path / 'mst_swin-t_mmdet.pth'
    converted = converter.main([checkpoint, str(out), '--target', 'mmdet'])
    saved = torch.load(out, weights_only=True)
    assert set(saved['state_dict']) == {f'backbone.{k}' for k in converted}
    assert saved['meta']['weights'] == 'teacher' and saved['meta']['epoch'] == 100

    cfg = Config.fromfile(str(DET_CONFIG))
    cfg.model.backbone.init_cfg.checkpoint = str(out)
    backbone = pretrained_backbone(cfg.model, MODELS)
    assert_loads_exactly(backbone, converted)
    teacher = model.teacher.module[0]
    torch.testing.assert_close(converted['stages.2.blocks.5.attn.w_msa.qkv.weight'],
                               teacher.stages[2].blocks[5].attn.w_msa.qkv.weight)
    # Same weights, same function: mmdet's last stage equals the MST teacher's final map.
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(backbone(images)[3], teacher.forward_mst(images).feat_map,
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_deit_into_mmseg_backbone_keys_and_outputs_match(deit_mst, tmp_path):
    from mmseg.registry import MODELS
    model, checkpoint = deit_mst
    cfg = Config.fromfile(str(SEG_CONFIG))
    # At the pretraining size first, where no position embedding is resized.
    cfg.model.backbone.img_size = (224, 224)
    config_224 = tmp_path / 'setr_224.py'
    cfg.dump(str(config_224))
    out = tmp_path / 'student.pth'
    converted = converter.main([checkpoint, str(out), '--target', 'mmseg',
                                '--weights', 'student', '--config', str(config_224)])
    assert 'layers.3.attn.attn.in_proj_weight' in converted
    assert not any(k.startswith('backbone.') for k in torch.load(out)['state_dict'])

    cfg.model.backbone.init_cfg.checkpoint = str(out)
    backbone = pretrained_backbone(cfg.model, MODELS)
    assert_loads_exactly(backbone, converted)
    torch.testing.assert_close(converted['patch_embed.projection.bias'],
                               model.backbone.patch_embed.projection.bias)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(backbone(images)[-1],
                                   model.backbone.forward_mst(images).feat_map,
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('bad, message', [
    ('not_mst', 'is not an MST training checkpoint'),
    ('wrong_framework', 'holds an MST Swin backbone: use --target mmdet'),
    ('wrong_size', 'does not match the backbone of the mmseg config: missing'),
    ('same_path', 'OUT is the input checkpoint'),
])
def test_converter_refuses_what_it_cannot_convert(bad, message, swin_mst, deit_mst, tmp_path):
    args = {
        'not_mst': [tmp_path / 'vit.pth', '--target', 'mmseg'],
        'wrong_framework': [swin_mst[1], '--target', 'mmseg'],
        'wrong_size': [deit_mst[1], '--target', 'mmseg', '--config', tmp_path / 'vit-b.py'],
        'same_path': [deit_mst[1], '--target', 'mmseg'],
    }[bad]
    torch.save({'state_dict': deit_mst[0].backbone.state_dict()}, tmp_path / 'vit.pth')
    bigger = Config.fromfile(str(SEG_CONFIG))
    bigger.model.backbone.num_layers = 13
    bigger.dump(str(tmp_path / 'vit-b.py'))
    out = args[0] if bad == 'same_path' else tmp_path / 'out.pth'
    with pytest.raises(ValueError, match=message):
        converter.main([str(args[0]), str(out), *map(str, args[1:])])
    if bad != 'same_path':
        assert not out.exists()


class RunsCode:
    def __reduce__(self):
        return (os.system, ('touch ran',))


def test_converter_refuses_a_pickle_that_would_run_code(tmp_path, monkeypatch):
    evil = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': RunsCode()}, evil)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r'Refusing to load .*evil\.pth.*system'):
        converter.main([str(evil), str(tmp_path / 'out.pth'), '--target', 'mmdet'])
    assert not (tmp_path / 'ran').exists()


def shrink_runner_cfg(cfg: Config) -> Config:
    cfg.log_level = 'WARNING'
    cfg.default_hooks.logger.interval = 1
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].num_workers = 0
        cfg[loader].persistent_workers = False
    return cfg


def train_and_test_with_our_tools(cfg: Config, tmp_path, checkpoint: str) -> dict:
    """`python tools/train.py CONFIG --work-dir DIR`, then `python tools/test.py CONFIG
    DIR/checkpoint` on the val split, in this process; returns the test metrics."""
    cfg.test_dataloader, cfg.test_evaluator = cfg.val_dataloader, cfg.val_evaluator
    config = tmp_path / 'downstream_config.py'
    cfg.dump(str(config))
    load_tool('tools/train.py').main([str(config), '--work-dir', str(tmp_path / 'work')])
    out = tmp_path / 'test_metrics.json'
    load_tool('tools/test.py').main([str(config), str(tmp_path / 'work' / checkpoint),
                                     '--work-dir', str(tmp_path / 'test'), '--out', str(out),
                                     '--out-item', 'metrics'])
    return json.loads(out.read_text())


@pytest.mark.slow
def test_mask_rcnn_trains_and_evaluates_from_the_converted_checkpoint(swin_mst, tmp_path):
    data_root = make_tiny_coco(tmp_path / 'coco') + '/'
    converter.main([swin_mst[1], str(tmp_path / 'swin.pth'), '--target', 'mmdet'])
    cfg = shrink_runner_cfg(Config.fromfile(str(DET_CONFIG)))
    cfg.model.backbone.init_cfg.checkpoint = str(tmp_path / 'swin.pth')
    # An untrained head scores every class near 1/81, below the stock 0.05 threshold, and
    # an empty result has no AP at all.
    cfg.model.test_cfg.rcnn.score_thr = 0.0
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = data_root
        resize = next(t for t in loader.dataset.pipeline if t.type == 'Resize')
        resize.scale = (160, 128)  # keeps the tiny images' sizes: batches stay ragged
    cfg.train_dataloader.batch_size = 2
    cfg.val_evaluator.ann_file = data_root + 'annotations/instances_val2017.json'
    cfg.train_cfg.max_epochs = 1

    tested = train_and_test_with_our_tools(cfg, tmp_path, 'epoch_1.pth')
    logged = scalars(tmp_path / 'work')
    assert [line['step'] for line in logged if 'loss' in line] == [1, 2]
    assert all(torch.isfinite(torch.tensor(line['loss'])) for line in logged if 'loss' in line)
    # The saved checkpoint is the model that was validated at the end of training.
    metrics = next(line for line in logged if 'coco/bbox_mAP' in line)
    for name in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert tested[name] == pytest.approx(metrics[name])


def small_setr_cfg(tmp_path) -> Tuple[Config, str]:
    """SETR shrunk to 128 px, batch 2 and 2 iterations on tiny generated Cityscapes data,
    and the path of its dump (what the converter reads the position-embedding grid from)."""
    data_root = make_tiny_cityscapes(tmp_path / 'cityscapes') + '/'
    cfg = shrink_runner_cfg(Config.fromfile(str(SEG_CONFIG)))
    size = (128, 128)
    cfg.model.backbone.img_size = size
    cfg.model.data_preprocessor.size = size
    cfg.model.test_cfg = dict(mode='slide', crop_size=size, stride=(96, 96))
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = data_root
    train_pipeline = cfg.train_dataloader.dataset.pipeline
    next(t for t in train_pipeline if t.type == 'RandomResize').scale = (256, 128)
    next(t for t in train_pipeline if t.type == 'RandomCrop').crop_size = size
    next(t for t in cfg.val_dataloader.dataset.pipeline if t.type == 'Resize').scale = (256, 128)
    cfg.train_dataloader.batch_size = 2
    cfg.train_cfg.max_iters = cfg.train_cfg.val_interval = 2
    small_config = str(tmp_path / 'setr_small.py')
    cfg.dump(small_config)
    return cfg, small_config


@pytest.mark.slow
def test_setr_trains_and_evaluates_from_the_converted_checkpoint(deit_mst, tmp_path):
    cfg, small_config = small_setr_cfg(tmp_path)
    # The converter resizes the 14 x 14 position embedding to the 8 x 8 grid of 128 px.
    converted = converter.main([deit_mst[1], str(tmp_path / 'deit.pth'), '--target', 'mmseg',
                                '--config', small_config])
    assert converted['pos_embed'].shape == (1, 65, 384)
    cfg.model.backbone.init_cfg.checkpoint = str(tmp_path / 'deit.pth')

    tested = train_and_test_with_our_tools(cfg, tmp_path, 'iter_2.pth')
    logged = scalars(tmp_path / 'work')
    assert [line['step'] for line in logged if 'loss' in line] == [1, 2]
    metrics = next(line for line in logged if 'mIoU' in line)
    assert tested['mIoU'] == pytest.approx(metrics['mIoU'])
