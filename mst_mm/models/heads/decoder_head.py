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
    r"""Nearest 2x upsampling followed by a 3x3 convolution (padding 1), computed at the
    input's resolution.

    After nearest upsampling, along each axis the output pixel :math:`2i` sees the inputs
    :math:`i-1, i, i` under the kernel taps :math:`w_0, w_1, w_2`, and :math:`2i+1` sees
    :math:`i, i, i+1`: two 2-tap kernels, :math:`(w_0, w_1 + w_2)` and
    :math:`(w_0 + w_1, w_2)`. In 2-D, the four output phases are four 2x2 convolutions of
    the (zero-padded) input, run as one convolution with 4x the output channels and
    interleaved. The result equals ``conv3x3(upsample(x))`` (up to float rounding) with
    16 instead of 36 multiply-adds per input pixel and output channel, and nothing is
    convolved at the upsampled size. Neither torch nor mmcv has this fused form.

    Args:
        x (Tensor): (B, C_in, H, W).
        weight (Tensor): (C_out, C_in, 3, 3).
        bias (Tensor, optional): (C_out,).

    Returns:
        Tensor: (B, C_out, 2H, 2W).
    """
    def two_taps(k: torch.Tensor, dim: int):
        first, middle, last = k.unbind(dim)
        return (torch.stack([first, middle + last], dim),   # even outputs: window i-1, i
                torch.stack([first + middle, last], dim))   # odd outputs: window i, i+1

    kernels = torch.cat([phase for rows in two_taps(weight, 2)
                         for phase in two_taps(rows, 3)])   # phases (0,0), (0,1), (1,0), (1,1)
    out = F.conv2d(F.pad(x, (1, 1, 1, 1)), kernels)         # (B, 4 C_out, H + 1, W + 1)
    batch, _, height, width = x.shape
    out = out.view(batch, 2, 2, weight.shape[0], height + 1, width + 1)
    # Phase (a, b) of output pixel (i, j) is the window starting at (i + a, j + b).
    rows = [torch.stack([out[:, a, b, :, a:a + height, b:b + width] for b in (0, 1)], -1)
            for a in (0, 1)]
    out = torch.stack(rows, 3).reshape(batch, -1, 2 * height, 2 * width)
    return out if bias is None else out + bias.view(1, -1, 1, 1)


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
            stages += [
                # Where an nn.Upsample stood before the stages were fused: the parameter
                # names (decoder.1.conv.weight, ...) stay those of earlier checkpoints.
                nn.Identity(),
                Upsample2xConvModule(prev, width, 3, padding=1,
                                     norm_cfg=norm_cfg or dict(type='BN'),
                                     act_cfg=dict(type='ReLU')),
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
