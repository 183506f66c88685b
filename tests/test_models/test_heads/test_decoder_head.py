"""ImageDecoderHead: four 2x stages of upsample-conv-BN-ReLU and the L1 loss (Eq. 10)."""
import pytest
import torch
import torch.nn as nn

from mst_mm.models import ImageDecoderHead
from mst_mm.models.heads.decoder_head import Upsample2xConvModule


def test_four_stages_reach_full_resolution():
    head = ImageDecoderHead(in_channels=24, channels=(16, 8, 8, 4))
    out = head(torch.randn(2, 24, 14, 14))
    assert out.shape == (2, 3, 224, 224)
    # Four 2x stages (each upsamples inside its fused convolution:
    # tests/test_models/test_algorithms/test_step_speedups.py)
    assert sum(isinstance(m, Upsample2xConvModule) for m in head.modules()) == 4
    assert sum(isinstance(m, nn.BatchNorm2d) for m in head.modules()) == 4


def test_loss_is_weighted_mean_absolute_error_over_the_whole_image():
    torch.manual_seed(0)
    head = ImageDecoderHead(in_channels=8, channels=(4, 4), loss_weight=0.6)
    feat, target = torch.randn(2, 8, 4, 4), torch.randn(2, 3, 16, 16)
    head.eval()
    expected = 0.6 * (head(feat) - target).abs().mean()
    torch.testing.assert_close(head.loss(feat, target), expected)


def test_resolution_mismatch_names_the_fix():
    head = ImageDecoderHead(in_channels=8, channels=(4, 4, 4))
    with pytest.raises(ValueError, match='backbone stride'):
        head.loss(torch.randn(1, 8, 4, 4), torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match='loss_weight'):
        ImageDecoderHead(in_channels=8, loss_weight=-0.1)
