"""Widths that do not fit between backbone, neck, head and decoder are refused when MST is
built, naming the config key and the value that fixes it."""
import re

import pytest
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.models.utils.channel_check import backbone_channels, channel_mismatches
from tests.conftest import TINY_MST, tiny_mst_cfg
from tests.helpers import REPO

TINY_SWIN = dict(type='MaskSwin', arch=dict(embed_dims=16, depths=[1, 2], num_heads=[2, 4]),
                 img_size=32, window_size=4, out_indices=(1, ), pad_small_map=True)


def with_(part: str, **changes) -> dict:
    return tiny_mst_cfg(**{part: {**TINY_MST[part], **changes}})


def test_neck_head_and_decoder_widths_are_checked_at_build_time():
    with pytest.raises(ValueError, match=re.escape(
            'model.neck.in_channels=64 but the backbone (MaskViT with a custom arch) outputs '
            '32 channels: set model.neck.in_channels=32.')):
        MODELS.build(with_('neck', in_channels=64))
    with pytest.raises(ValueError, match=re.escape(
            'model.head.out_channels=512 but model.neck.out_channels=128 (the number of '
            'prototypes): set model.head.out_channels=128 (or model.neck.out_channels=512).')):
        MODELS.build(with_('head', out_channels=512))
    with pytest.raises(ValueError, match=re.escape(
            'model.decoder_head.in_channels=16 but the backbone (MaskViT with a custom arch) '
            'outputs 32 channels: set model.decoder_head.in_channels=32.')):
        MODELS.build(with_('decoder_head', in_channels=16))


def test_every_mismatch_is_listed_at_once():
    cfg = tiny_mst_cfg(neck={**TINY_MST['neck'], 'in_channels': 8, 'out_channels': 64},
                       decoder_head={**TINY_MST['decoder_head'], 'in_channels': 8})
    with pytest.raises(ValueError) as error:
        MODELS.build(cfg)
    message = str(error.value)
    for key in ('model.neck.in_channels=8', 'model.head.out_channels=128',
                'model.decoder_head.in_channels=8'):
        assert key in message


def test_swin_is_checked_against_its_last_stage_not_its_embed_dims():
    # MaskSwin's embed_dims (16) is the first stage's width; MST reads the last stage (32).
    ok = tiny_mst_cfg(backbone=TINY_SWIN)
    assert backbone_channels(MODELS.build(ok).backbone) == 32
    wrong = tiny_mst_cfg(backbone=TINY_SWIN, neck={**TINY_MST['neck'], 'in_channels': 16})
    with pytest.raises(ValueError, match=re.escape(
            'model.neck.in_channels=16 but the backbone (MaskSwin with a custom arch) outputs '
            '32 channels: set model.neck.in_channels=32.')):
        MODELS.build(wrong)


@pytest.mark.parametrize('config, arch, channels', [
    ('mst/mst_deit-s-p16_8xb128-coslr-100e_in1k.py', 'MaskViT deit-small', 384),
    ('mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py', 'MaskSwin tiny', 768),
])
def test_full_size_backbones_are_named_by_their_arch(config, arch, channels):
    model_cfg = Config.fromfile(str(REPO / 'configs' / config)).model
    backbone = MODELS.build(model_cfg.backbone)
    neck = MODELS.build({**model_cfg.neck, 'in_channels': 64, 'out_channels': 16})
    head = MODELS.build({**model_cfg.head, 'out_channels': 16})
    assert channel_mismatches(backbone, neck, head, backbone_cfg=model_cfg.backbone) == [
        f'model.neck.in_channels=64 but the backbone ({arch}) outputs {channels} channels: '
        f'set model.neck.in_channels={channels}.']
    neck = MODELS.build({**model_cfg.neck, 'in_channels': channels, 'out_channels': 16})
    assert channel_mismatches(backbone, neck, head, backbone_cfg=model_cfg.backbone) == []
