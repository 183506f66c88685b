"""The learnable [MASK] embedding that MaskViT and MaskSwin share (paper Eq. 7)."""
from typing import Optional

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import WEIGHT_INITIALIZERS

# init_cfg types that load a checkpoint: mmengine's, and ours that refuses missing weights.
PRETRAINED_INITS = ('Pretrained', 'CheckedPretrained')


class MaskTokenMixin:
    r"""Creates, initialises and inserts the [MASK] embedding of a backbone.

    .. math::
        (\mathbf m \odot \mathbf e)_i = [\mathrm{MASK}] \text{ if } m_i = 1 \text{ else } e_i

    Mixed in before the mmpretrain backbone, whose ``embed_dims`` sets the token width.
    """
    mask_token: Optional[nn.Parameter]

    def _create_mask_token(self, use_mask_token: bool) -> None:
        self.mask_token = (nn.Parameter(torch.zeros(1, 1, self.embed_dims))
                           if use_mask_token else None)

    def init_weights(self) -> None:
        init_cfg = self.init_cfg
        if isinstance(init_cfg, dict) and init_cfg.get('type') == 'CheckedPretrained':
            # mmengine loads only type='Pretrained' after the children's initialisation, and
            # mmpretrain's ViT and Swin keep a loaded position embedding only for that name:
            # initialise as without a checkpoint, then load it over everything.
            self.init_cfg = None
            try:
                super().init_weights()
            finally:
                self.init_cfg = init_cfg
            # From mmengine's registry: the initialiser lives in engine/, above models/.
            WEIGHT_INITIALIZERS.build(init_cfg)(self)
        else:
            super().init_weights()
        # A Pretrained init_cfg has just loaded the checkpoint's [MASK] token: keep it.
        if self.mask_token is not None and not self._init_cfg_loads_checkpoint():
            trunc_normal_(self.mask_token, std=.02)

    def _init_cfg_loads_checkpoint(self) -> bool:
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]
        return any(isinstance(cfg, dict) and cfg.get('type') in PRETRAINED_INITS
                   for cfg in cfgs)

    def _replace_with_mask_token(self, tokens: torch.Tensor,
                                 mask: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, C) where ``mask`` (B, N) is True become the [MASK] embedding."""
        if self.mask_token is None:
            raise ValueError(f'This {type(self).__name__} was built with '
                             '`use_mask_token=False` and cannot take a mask.')
        if mask.shape != tokens.shape[:2]:
            raise ValueError(f'Mask shape {tuple(mask.shape)} does not match the patch '
                             f'grid {tuple(tokens.shape[:2])}.')
        return torch.where(mask.unsqueeze(-1), self.mask_token.to(tokens.dtype), tokens)
