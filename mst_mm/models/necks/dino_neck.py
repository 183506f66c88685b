"""DINO's projection head, with MST's BatchNorm rule (paper Sec. 3.3, appendix "BatchNorm")."""
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmpretrain.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils.parametrizations import weight_norm


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

    With ``with_bn=True`` (the paper's best row, Table 5) the MLP is Linear-BN-GELU. MST
    updates BN running statistics from the global views only: call with
    ``update_bn_stats=False`` for the local crops.

    Args:
        in_channels (int): Backbone embedding size (384 for DeiT-S).
        hidden_channels (int): MLP width. Defaults to 2048.
        bottleneck_channels (int): Width before the last layer. Defaults to 256.
        out_channels (int): Number of prototypes K. Defaults to 65536.
        num_layers (int): Linear layers in the MLP. Defaults to 3.
        with_bn (bool): BatchNorm after the hidden linear layers. Defaults to True.
        norm_last_layer (bool): Freeze the weight-norm magnitude at 1, as DINO does for
            ViT-S. Defaults to True.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(self,
                 in_channels: int,
                 hidden_channels: int = 2048,
                 bottleneck_channels: int = 256,
                 out_channels: int = 65536,
                 num_layers: int = 3,
                 with_bn: bool = True,
                 norm_last_layer: bool = True,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        if num_layers < 1:
            raise ValueError(f'DINONeck needs num_layers >= 1, got {num_layers}.')
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
        # Set by FreezeLastLayerHook: DINO cancels the last layer's gradient in epoch 1.
        self.freeze_last_layer = False

    def init_weights(self) -> None:
        super().init_weights()
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor, update_bn_stats: bool = True) -> torch.Tensor:
        """Project embeddings (B, C) to prototype logits (B, K)."""
        if update_bn_stats:
            x = self.mlp(x)
        else:
            with frozen_bn_statistics(self.mlp):
                x = self.mlp(x)
        x = F.normalize(x, dim=-1, p=2)
        weight = self.last_layer.weight
        if self.freeze_last_layer:
            # No gradient reaches the last layer, so AdamW skips it entirely (grad is None),
            # as DINO's `cancel_gradients_last_layer` does. Under DDP this needs
            # `find_unused_parameters=True` (set in configs/_base_/default_runtime.py).
            weight = weight.detach()
        return F.linear(x, weight)
