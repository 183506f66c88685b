"""Backbone-only exports of an MST checkpoint: mmpretrain names, and timm names that load
into timm's vit_small_patch16_224 and give the same features as our backbone."""
import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.converters import extract_backbone, vit_to_timm
from mst_mm.errors import CheckpointError
from tests.helpers import DEMO_CONFIG, load_tool


def _mst_checkpoint_state(path, backbone_cfg: dict) -> dict:
    """An MST training checkpoint's backbone entries: a teacher that differs from the
    student, and the student's [MASK] token, written as tools/train.py writes them."""
    torch.manual_seed(0)
    student = MODELS.build(dict(type='MaskViT', **backbone_cfg))
    teacher = MODELS.build(dict(type='MaskViT', **backbone_cfg, use_mask_token=False))
    student.init_weights()
    teacher.init_weights()
    state = {f'backbone.{k}': v for k, v in student.state_dict().items()}
    state.update({f'teacher.module.0.{k}': v for k, v in teacher.state_dict().items()})
    torch.save(dict(state_dict=state, meta=dict(epoch=300, iter=375300)), path)
    teacher.eval()  # mmpretrain's ViT.train() returns None, so not chained
    return teacher


DEIT_S = dict(arch='deit-small', img_size=224, patch_size=16, out_type='cls_token')


@pytest.mark.slow
def test_timm_export_loads_into_timms_vit_small_and_gives_our_features(tmp_path):
    timm = pytest.importorskip('timm')
    teacher = _mst_checkpoint_state(tmp_path / 'epoch_300.pth', DEIT_S)
    tool = load_tool('tools/model_converters/mst2downstream.py')
    out = tmp_path / 'mst_deit-s_timm.pth'
    tool.main([str(tmp_path / 'epoch_300.pth'), str(out), '--target', 'timm'])

    exported = torch.load(out, weights_only=True)   # a bare state dict, as DINO ships
    assert 'state_dict' not in exported and 'blocks.11.mlp.fc2.weight' in exported
    model = timm.create_model('vit_small_patch16_224', pretrained=False, num_classes=0).eval()
    model.load_state_dict(exported, strict=True)    # every key, no more
    image = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = teacher(image)[-1]                   # the CLS token after the final norm
        theirs = model(image)                       # timm's pre-logits CLS token
    assert ours.shape == theirs.shape == (2, 384)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert ours.std() > 0.1                         # not a degenerate comparison


def test_mmpretrain_export_is_the_teacher_backbone_with_mmpretrains_names(tmp_path):
    cfg = Config.fromfile(DEMO_CONFIG)
    backbone_cfg = {k: v for k, v in cfg.model.backbone.items() if k != 'type'}
    backbone_cfg.pop('use_mask_token', None)
    teacher = _mst_checkpoint_state(tmp_path / 'epoch_10.pth', backbone_cfg)
    tool = load_tool('tools/model_converters/mst2downstream.py')
    out = tmp_path / 'backbone.pth'
    tool.main([str(tmp_path / 'epoch_10.pth'), str(out), '--target', 'mmpretrain'])
    saved = torch.load(out, weights_only=True)
    assert saved['meta']['weights'] == 'teacher' and saved['meta']['epoch'] == 300
    # Loads strictly into a plain mmpretrain VisionTransformer of the same size (no [MASK]).
    plain = MODELS.build(dict(type='VisionTransformer', **{
        k: v for k, v in backbone_cfg.items() if k in ('arch', 'img_size', 'patch_size')},
        out_type='cls_token'))
    plain.eval()
    plain.load_state_dict(saved['state_dict'], strict=True)
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(plain(image)[-1], teacher(image)[-1])


def test_timm_export_refuses_what_timm_cannot_hold():
    backbone = {'cls_token': torch.zeros(1, 1, 4), 'pos_embed': torch.zeros(1, 5, 4),
                'patch_embed.projection.weight': torch.zeros(4, 3, 2, 2),
                'layers.0.attn.qkv.weight': torch.zeros(12, 4),
                'layers.0.gamma1.weight': torch.zeros(4), 'ln1.weight': torch.zeros(4)}
    with pytest.raises(CheckpointError, match='layers.0.gamma1.weight'):
        vit_to_timm(backbone)
    with pytest.raises(CheckpointError, match='not an MST training checkpoint'):
        extract_backbone({'backbone.cls_token': torch.zeros(1)}, 'teacher')
