"""MST's global image decoder and its restoration loss (paper Eq. 10-11)."""
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS


@MODELS.register_module()
class ImageDecoderHead(BaseModule):
    r"""Conv decoder that restores the whole image from the student's patch features.

    Each stage is a 2x nearest upsampling followed by conv3x3-BN-ReLU (upsampling then
    convolution avoids the checkerboard artefacts of deconvolution, which is why the paper
    limits upsampling to 2x); a final conv3x3 maps to RGB. Four stages take a stride-16 map
    to full resolution. The loss is the mean absolute error over every pixel and channel of
    the normalised input, masked or not (Eq. 10):

    .. math::
        l_{restoring} = \lambda_2\,\mathbb E_{H\times W}\,|x - g(\theta_g; f_s(\theta_s; x, m))|

    The widths are chosen by cost (``tools/analysis/benchmark.py``; the paper gives none).
    Each stage upsamples *before* its conv, so the late stages run at 112 and 224 px and
    their cost, memory-bound on a CPU, grows with width. For DeiT-S at batch 16 on this
    project's 2-core CPU, (128, 64, 32, 16) (about 1.1 GMAC per 224-px crop) made an MST step
    1.34x a DINO step; the default (64, 32, 16, 8) (about 0.36 GMAC) brought it to 1.09x,
    with the decoder at 4 % of the step (README, "Cost against DINO").

    Args:
        in_channels (int): Channels of the input feature map (384 for DeiT-S).
        channels (Sequence[int]): Output width of each upsampling stage; its length is the
            number of 2x stages. Defaults to (64, 32, 16, 8).
        out_channels (int): Image channels. Defaults to 3.
        loss_weight (float): :math:`\lambda_2` of Eq. 12. Defaults to 0.6.
        norm_cfg (dict): Norm layer of each stage. Defaults to ``dict(type='BN')``; use
            ``SyncBN`` through the runner's ``sync_bn`` for DDP.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(self,
                 in_channels: int,
                 channels: Sequence[int] = (64, 32, 16, 8),
                 out_channels: int = 3,
                 loss_weight: float = 0.6,
                 norm_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if loss_weight < 0:
            raise ValueError(f'ImageDecoderHead loss_weight must be >= 0, got {loss_weight}.')
        if len(channels) < 1:
            raise ValueError('ImageDecoderHead needs at least one upsampling stage.')
        self.loss_weight = loss_weight
        self.channels = tuple(channels)
        self.upsample_factor = 2**len(channels)
        stages = []
        prev = in_channels
        for width in channels:
            stages += [
                nn.Upsample(scale_factor=2, mode='nearest'),
                ConvModule(prev, width, 3, padding=1,
                           norm_cfg=norm_cfg or dict(type='BN'), act_cfg=dict(type='ReLU')),
            ]
            prev = width
        self.decoder = nn.Sequential(*stages, nn.Conv2d(prev, out_channels, 3, padding=1))

    def forward(self, feat_map: torch.Tensor) -> torch.Tensor:
        """Decode (B, C, h, w) to an image (B, 3, h * 2^S, w * 2^S)."""
        return self.decoder(feat_map)

    def loss(self, feat_map: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Weighted L1 between the reconstruction and the (normalised) input image."""
        restored = self(feat_map)
        if restored.shape[-2:] != target.shape[-2:]:
            raise ValueError(
                f'The decoder restores {tuple(restored.shape[-2:])} px from a '
                f'{tuple(feat_map.shape[-2:])} feature map, but the image is '
                f'{tuple(target.shape[-2:])} px: make 2**len(channels) equal the backbone '
                f'stride ({self.upsample_factor} now).')
        return self.loss_weight * F.l1_loss(restored.float(), target.float())
