"""DINO's projection head, with MST's BatchNorm rule (paper Sec. 3.3, appendix "BatchNorm")."""
from contextlib import contextmanager
from typing import Iterator, List

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmpretrain.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils.parametrizations import weight_norm

from ..utils.precision import at_least_float32, float32_region


@contextmanager
def frozen_bn_statistics(module: nn.Module) -> Iterator[None]:
    """Normalise with batch statistics but leave every BN's running statistics untouched.

    Works for ``BatchNorm1d`` and ``SyncBatchNorm``: with ``track_running_stats=False`` in
    training mode both pass no running buffers to the kernel, so nothing is updated.
    """
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    for m in norms:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in norms:
            m.track_running_stats = True


@MODELS.register_module()
class DINONeck(BaseModule):
    """3-layer MLP, L2 normalisation and a weight-normalised last layer (DINO).

    ``x -> MLP -> bottleneck -> x / ||x||_2 -> WeightNorm(Linear) -> logits``.

    With ``with_bn=True`` the MLP is Linear-BN-GELU (paper Table 5). ``bn_statistics`` picks
    how BN sees the crops (call :meth:`forward_crops`):

    - ``'global_crops'`` (MST, paper appendix "BatchNorm"): the running statistics are
      updated from the global views only; the local crops are normalised with their own
      batch statistics and leave the running statistics untouched.
    - ``'all_crops'`` (DINO's head with ``use_bn=True``, Table 5 "Baseline w/ BN"): one BN
      pass over all crops together, which normalises and updates with all of them.

    Args:
        in_channels (int): Backbone embedding size (384 for DeiT-S).
        hidden_channels (int): MLP width. Defaults to 2048.
        bottleneck_channels (int): Width before the last layer. Defaults to 256.
        out_channels (int): Number of prototypes K. Defaults to 65536.
        num_layers (int): Linear layers in the MLP. Defaults to 3.
        with_bn (bool): BatchNorm after the hidden linear layers. Defaults to True.
        bn_statistics (str): ``'global_crops'`` or ``'all_crops'``, see above. Defaults to
            ``'global_crops'``.
        norm_last_layer (bool): Hold the weight-norm magnitude fixed at 1 (DINO's
            ``norm_last_layer``). DINO's default is True, but its README and its help text
            recommend False for ViT-S/DeiT-S ("typically False with vit_small and True with
            vit_base"; the 300-epoch DeiT-S command passes ``--norm_last_layer false``), which
            is what the DeiT-S configs set. Defaults to True.
        init_cfg (dict, optional): Initialization config.
    """
    BN_STATISTICS = ('global_crops', 'all_crops')

    def __init__(self,
                 in_channels: int,
                 hidden_channels: int = 2048,
                 bottleneck_channels: int = 256,
                 out_channels: int = 65536,
                 num_layers: int = 3,
                 with_bn: bool = True,
                 bn_statistics: str = 'global_crops',
                 norm_last_layer: bool = True,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        if num_layers < 1:
            raise ValueError(f'DINONeck needs num_layers >= 1, got {num_layers}.')
        if bn_statistics not in self.BN_STATISTICS:
            raise ValueError(f'DINONeck bn_statistics must be one of {self.BN_STATISTICS}, '
                             f'got {bn_statistics!r}.')
        self.bn_statistics = bn_statistics
        layers = []
        channels = in_channels
        for _ in range(num_layers - 1):
            layers.append(nn.Linear(channels, hidden_channels))
            if with_bn:
                layers.append(nn.BatchNorm1d(hidden_channels))
            layers.append(nn.GELU())
            channels = hidden_channels
        layers.append(nn.Linear(channels, bottleneck_channels))
        self.mlp = nn.Sequential(*layers)

        self.last_layer = weight_norm(nn.Linear(bottleneck_channels, out_channels, bias=False))
        magnitude = self.last_layer.parametrizations.weight.original0
        magnitude.data.fill_(1.0)
        magnitude.requires_grad = not norm_last_layer

    def init_weights(self) -> None:
        super().init_weights()
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor, update_bn_stats: bool = True) -> torch.Tensor:
        """Project embeddings (B, C) to prototype logits (B, K)."""
        return self._prototypes(self._mlp(x, update_bn_stats))

    def _mlp(self, x: torch.Tensor, update_bn_stats: bool = True) -> torch.Tensor:
        if update_bn_stats:
            return self.mlp(x)
        with frozen_bn_statistics(self.mlp):
            return self.mlp(x)

    def _prototypes(self, x: torch.Tensor) -> torch.Tensor:
        """L2 normalisation and the weight-normalised last layer, in float32 whatever the
        autocast context: the teacher's logits are divided by 0.04 and sharpened, and a
        logit rounded to bfloat16's 8 bits of mantissa would move its probability by up to
        a factor exp(|logit| 2**-8 / 0.04)."""
        with float32_region(x.device):
            return self.last_layer(F.normalize(at_least_float32(x), dim=-1, p=2))

    def forward_crops(self, global_feat: torch.Tensor,
                      local_feats: List[torch.Tensor]) -> torch.Tensor:
        """Logits of every crop, global crops first, with BN following ``bn_statistics``.

        Only the MLP runs twice (BN must see the two groups apart); the bottleneck features
        of all crops then go through the last layer together, so its weight ``g v / ||v||``
        (K x 256, 16.8 M values for K = 65536) is formed, and back-propagated, once per
        step instead of once per group.

        Args:
            global_feat (Tensor): (G * B, C) embeddings of the global crops.
            local_feats (List[Tensor]): (n * B, C) embeddings of the local crops, any
                number of tensors (one per crop size, say).

        Returns:
            Tensor: ((G + L) * B, K), in the order of the inputs.
        """
        if self.bn_statistics == 'all_crops' or not local_feats:
            return self(torch.cat([global_feat, *local_feats]))
        bottleneck = torch.cat([self._mlp(global_feat),
                                self._mlp(torch.cat(local_feats), update_bn_stats=False)])
        return self._prototypes(bottleneck)
