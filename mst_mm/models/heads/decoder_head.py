"""MST's global image decoder and its restoration loss (paper Eq. 10-11)."""
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS


def upsample2x_conv3x3(x: torch.Tensor, weight: torch.Tensor,
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""Nearest 2x upsampling followed by a 3x3 convolution (padding 1), computed as one
    transposed convolution at the input's resolution.

    After nearest upsampling, along each axis the output pixel :math:`2i` sees the inputs
    :math:`i-1, i, i` under the kernel taps :math:`w_0, w_1, w_2`, and :math:`2i+1` sees
    :math:`i, i, i+1`. A transposed convolution with stride 2, padding 1 and a 4-tap
    kernel :math:`k` gives output :math:`o` the inputs :math:`i` with :math:`o = 2i - 1 + t`:
    :math:`2i` gets :math:`x_{i-1}` under :math:`k_3` and :math:`x_i` under :math:`k_1`,
    :math:`2i+1` gets :math:`x_i` under :math:`k_2` and :math:`x_{i+1}` under :math:`k_0`.
    Hence :math:`k = (w_2,\ w_1 + w_2,\ w_0 + w_1,\ w_0) = A w` and, in 2-D,

    .. math::
        K = A\,W A^\top, \qquad A = \begin{pmatrix} 0&0&1\\ 0&1&1\\ 1&1&0\\ 1&0&0
        \end{pmatrix}.

    The result equals ``conv3x3(upsample(x))`` (up to float rounding) with 16 instead of 36
    multiply-adds per input pixel and output channel, and nothing is convolved at the
    upsampled size; forward and backward are each one library kernel (running the four output
    phases as 2x2 convolutions and interleaving them costs, on a CPU, as much in the
    interleaving and its slices' zero-filled gradients as in the convolutions).

    Args:
        x (Tensor): (B, C_in, H, W).
        weight (Tensor): (C_out, C_in, 3, 3).
        bias (Tensor, optional): (C_out,).

    Returns:
        Tensor: (B, C_out, 2H, 2W).
    """
    kernel = _four_taps(_four_taps(weight, -2), -1)        # A W A^T: (C_out, C_in, 4, 4)
    return F.conv_transpose2d(x, kernel.transpose(0, 1), bias, stride=2, padding=1)


def _four_taps(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """:math:`A w` along ``dim``: :math:`(w_2, w_1 + w_2, w_0 + w_1, w_0)`, as sums rather
    than a product with a constant matrix, which would be a tensor made from Python data
    (a copy to the GPU, with a stream synchronisation) at every step."""
    w0, w1, w2 = weight.unbind(dim)
    return torch.stack([w2, w1 + w2, w0 + w1, w0], dim)


class ChannelsLastConv2d(nn.Conv2d):
    """``nn.Conv2d`` run on a channels-last copy of its input. For the decoder's last conv
    (8 channels to 3 at full size) oneDNN's CPU backward is about 4x faster in this layout
    than in the contiguous one (docs/benchmarks.md); the parameters are a Conv2d's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.contiguous(memory_format=torch.channels_last))


class Upsample2xConvModule(ConvModule):
    """mmcv's conv-norm-act block whose convolution sees its input upsampled 2x (nearest),
    computed fused by :func:`upsample2x_conv3x3`; the parameters are a ConvModule's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = upsample2x_conv3x3(x, self.conv.weight, self.conv.bias)
        if self.with_norm:
            x = self.norm(x)
        return self.activate(x) if self.with_activation else x


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

    The widths are chosen by cost (the paper gives none). Each stage upsamples *before* its
    conv, so the late stages run at 112 and 224 px and their cost, memory-bound on a CPU,
    grows with width: (128, 64, 32, 16) is about 1.1 GMAC per 224-px crop, the default
    (64, 32, 16, 8) about 0.36 GMAC. :class:`Upsample2xConvModule` computes each stage at
    its input's size.

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
            stages.append(Upsample2xConvModule(prev, width, 3, padding=1,
                                               norm_cfg=norm_cfg or dict(type='BN'),
                                               act_cfg=dict(type='ReLU')))
            prev = width
        self.decoder = nn.Sequential(*stages,
                                     ChannelsLastConv2d(prev, out_channels, 3, padding=1))

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
