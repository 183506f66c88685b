"""A Swin Transformer that takes MST's mask and gives attention guidance without a CLS token."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmpretrain.models import SwinTransformer
from mmpretrain.models.utils import resize_pos_embed
from mmpretrain.registry import MODELS

from ..utils.precision import at_least_float32, float32_region
from .mask_token import MaskTokenMixin
from .mask_vit import MSTFeatures

SWIN_GUIDANCE_RULES = ('pooled_query', 'pooled_similarity')


def pooled_query_attention(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    r"""The attention that the average token, used as a query, pays to every token.

    The Swin counterpart of Eq. 5. In DeiT the CLS token is the image representation that
    DINO trains, and its attention over the patches guides the mask. Swin has no CLS token:
    its image representation is the average of the last stage's tokens (what the projection
    neck receives). So the query is that average, projected by the last block's own
    ``qkv`` after its ``norm1``; the keys are the block's keys for every token:

    .. math::
        Attn = \frac{1}{H}\sum_{h=1}^{H}\mathrm{Softmax}\Big(q_h(\bar x)\cdot
               \frac{K_h^T}{\sqrt d}\Big),\qquad \bar x = \frac{1}{N}\sum_i x_i

    The softmax runs over all N tokens of the map, not over one window: the average token
    belongs to no window, as the CLS token in DeiT attends to every patch. No relative
    position bias is added, since the average token has no position (nor does the CLS token).
    At 224 px the last stage is 7 x 7, one window of Swin-T, so the keys are those the block
    itself compares. The cost is O(N).

    Args:
        block (nn.Module): The last ``SwinBlock`` of the last stage.
        x (Tensor): Its input tokens, (B, N, C).

    Computed in float32 whatever the autocast context: it ranks the tokens for the mask.

    Returns:
        Tensor: (B, heads, N), each row summing to 1, float32.
    """
    w_msa = block.attn.w_msa
    batch, tokens, channels = x.shape
    heads = w_msa.num_heads
    with float32_region(x.device):
        x = at_least_float32(x)
        normed = block.norm1(torch.cat([x.mean(dim=1, keepdim=True), x], dim=1))
        qkv = w_msa.qkv(normed).reshape(batch, tokens + 1, 3, heads, channels // heads)
        query = qkv[:, :1, 0].transpose(1, 2)          # (B, heads, 1, d)
        keys = qkv[:, 1:, 1].transpose(1, 2)           # (B, heads, N, d)
        scores = (query @ keys.transpose(-2, -1)) * w_msa.scale
        return scores.softmax(dim=-1)[:, :, 0]


def pooled_similarity(tokens: torch.Tensor) -> torch.Tensor:
    r"""Cosine similarity of each output token to the average output token.

    A guidance rule with no attention at all, for ablation against
    :func:`pooled_query_attention`: a token that resembles the image representation
    little is a candidate for the mask.

    .. math::
        s_i = \cos\big(x_i, \tfrac{1}{N}\textstyle\sum_j x_j\big)

    Args:
        tokens (Tensor): The last stage's normed output, (B, N, C).

    Returns:
        Tensor: (B, N), in [-1, 1], float32 whatever the autocast context.
    """
    with float32_region(tokens.device):
        tokens = at_least_float32(tokens)
        return F.cosine_similarity(tokens, tokens.mean(dim=1, keepdim=True), dim=-1)


def upsample_mask(mask: torch.Tensor, grid: Tuple[int, int], factor: int,
                  patch_grid: Tuple[int, int]) -> torch.Tensor:
    """Spread a mask drawn on the guidance grid over the 4-px patches it covers.

    Swin's patch merging pads at the bottom and right (``padding='corner'``), so guidance
    cell (i, j) covers patches [i * factor, (i + 1) * factor) in both directions; cells that
    overhang the image are cropped.

    Args:
        mask (BoolTensor): (B, grid_h * grid_w).
        grid (tuple): (grid_h, grid_w), the last stage's resolution.
        factor (int): Patches per guidance cell along each side.
        patch_grid (tuple): (h, w) of the patch embedding.

    Returns:
        BoolTensor: (B, h * w).
    """
    batch = mask.shape[0]
    cells = mask.reshape(batch, *grid)
    patches = cells.repeat_interleave(factor, dim=1).repeat_interleave(factor, dim=2)
    return patches[:, :patch_grid[0], :patch_grid[1]].reshape(batch, -1)


@MODELS.register_module()
class MaskSwin(MaskTokenMixin, SwinTransformer):
    r"""mmpretrain's ``SwinTransformer`` with MST's [MASK] embedding and attention guidance.

    Swin has no CLS token, so both the mask grid and the guidance live on the **last
    stage's** token grid (stride 32 for Swin-T: 7 x 7 at 224 px). This is the grid on which
    the image representation is formed, and it keeps what the paper's DeiT-S masks: each
    masked cell is one token of the final map. A cell is 8 x 8 of Swin's 4-px patches, so a
    mask drawn there is upsampled by 8 and the [MASK] embedding replaces those patch
    embeddings (after the patch embedding's norm; Swin-T has no absolute position
    embedding). With ``num=8, p=0.1``, about p / num of the image is masked, as for DeiT-S.

    ``guidance`` selects the rule that ranks the cells (Eq. 6 masks the lowest):

    - ``'pooled_query'`` (default): :func:`pooled_query_attention`, the Swin reading of
      Eq. 5 (the attention of the image representation, here the average token, over the
      tokens of the last block).
    - ``'pooled_similarity'``: :func:`pooled_similarity`, cosine similarity of each output
      token to the average one; an attention-free ablation.

    The image decoder starts from the last stage's map, the representation the DINO loss
    trains: Swin-T's stride of 32 takes five 2x stages to reach the input size
    (``feat_stride``). ``forward`` is mmpretrain's, so the trained weights serve every
    mmpretrain tool and the converters, and checkpoints load as into mmpretrain's
    ``SwinTransformer``, legacy (version-1) ones included.

    Args:
        use_mask_token (bool): Create the learnable [MASK] embedding (student only).
            Defaults to True.
        guidance (str): ``'pooled_query'`` or ``'pooled_similarity'``.
            Defaults to ``'pooled_query'``.
        **kwargs: The arguments of mmpretrain's ``SwinTransformer``. ``out_indices`` must
            include the last stage, whose norm gives the final map.
    """

    def __init__(self, *args, use_mask_token: bool = True, guidance: str = 'pooled_query',
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if guidance not in SWIN_GUIDANCE_RULES:
            raise ValueError(f'Unknown Swin guidance {guidance!r}: choose one of '
                             f'{SWIN_GUIDANCE_RULES}.')
        last = self.num_layers - 1
        if last not in self.out_indices or self.out_after_downsample:
            raise ValueError(f'MaskSwin needs out_indices to include the last stage ({last}) '
                             f'and out_after_downsample=False: MST reads the final normed '
                             f'map; got out_indices={self.out_indices}.')
        self.guidance = guidance
        self._create_mask_token(use_mask_token)

    @property
    def feat_stride(self) -> int:
        """Pixels per last-stage token: the decoder must upsample by this factor."""
        return self.patch_embed.projection.stride[0] * self.cell_size

    @property
    def cell_size(self) -> int:
        """Patches per last-stage token along each side (2 per patch merging)."""
        return 2**(self.num_layers - 1)

    def forward_mst(self,
                    x: torch.Tensor,
                    mask: Optional[torch.Tensor] = None,
                    with_attn: bool = False,
                    with_patches: bool = True) -> MSTFeatures:
        """One pass that returns the pooled feature, the final map and, optionally, guidance.

        Args:
            x (Tensor): Images, (B, 3, H, W).
            mask (BoolTensor, optional): (B, n), True where the last-stage cell becomes
                [MASK]; n is the number of last-stage tokens.
            with_attn (bool): Also return the guidance of ``self.guidance`` over the n cells.
            with_patches (bool): Accepted for MST's call; the map is returned either way,
                since the pooled feature needs every token.

        Returns:
            MSTFeatures: ``global_feat`` is the average of the final normed tokens (as
            Swin's classifier pools them), ``feat_map`` the final map (B, C, h, w).
        """
        x, hw_shape = self.patch_embed(x)
        if mask is not None:
            x = self._apply_mask(x, hw_shape, mask)
        if self.use_abs_pos_embed:
            x = x + resize_pos_embed(self.absolute_pos_embed, self.patch_resolution, hw_shape,
                                     self.interpolate_mode, self.num_extra_tokens)
        x = self.drop_after_pos(x)

        *early_stages, last_stage = self.stages
        for stage in early_stages:
            x, hw_shape = stage(x, hw_shape)
        *early_blocks, last_block = last_stage.blocks
        for block in early_blocks:
            x = block(x, hw_shape)
        attn_heads = None
        if with_attn and self.guidance == 'pooled_query':
            with torch.no_grad():
                attn_heads = pooled_query_attention(last_block, x)
        x = last_block(x, hw_shape)
        tokens = getattr(self, f'norm{self.num_layers - 1}')(x)

        attn = attn_heads.mean(dim=1) if attn_heads is not None else None
        if with_attn and self.guidance == 'pooled_similarity':
            with torch.no_grad():
                attn = pooled_similarity(tokens)
        feat_map = tokens.transpose(1, 2).reshape(x.shape[0], -1, *hw_shape)
        return MSTFeatures(tokens.mean(dim=1), feat_map, attn, attn_heads, tuple(hw_shape))

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict,
                              *args, **kwargs) -> None:
        """Convert legacy keys as mmpretrain's ``SwinTransformer`` does, then load.

        mmpretrain upgrades version-1 checkpoints (the last stage's norm saved as ``norm.*``,
        now ``norm{last}.*``) and drops the ``attn_mask`` buffers of versions before 3, but
        only when ``self.__class__ is SwinTransformer``: a subclass would leave ``norm3``
        missing. The same conversions run here, on this module's keys only.

        Args:
            state_dict (dict): The whole state dict being loaded; edited in place.
            prefix (str): This module's key prefix in it.
            local_metadata (dict): This module's metadata; ``version`` is the one saved.
            *args: The remaining arguments of ``nn.Module._load_from_state_dict``.
            **kwargs: The same.
        """
        version = local_metadata.get('version')
        if version is None or version < 2:
            legacy = prefix + 'norm.'
            for key in [k for k in state_dict if k.startswith(legacy)]:
                new_key = f'{prefix}norm{len(self.stages) - 1}.{key[len(legacy):]}'
                state_dict[new_key] = state_dict.pop(key)
        if version is None or version < 3:
            for key in [k for k in state_dict if k.startswith(prefix) and 'attn_mask' in k]:
                del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def _apply_mask(self, x: torch.Tensor, hw_shape: Tuple[int, int],
                    mask: torch.Tensor) -> torch.Tensor:
        cells = self.cell_size
        grid = (-(-hw_shape[0] // cells), -(-hw_shape[1] // cells))
        if mask.shape != (x.shape[0], grid[0] * grid[1]):
            raise ValueError(f'Mask shape {tuple(mask.shape)} does not match the last-stage '
                             f'grid {grid} of this {tuple(hw_shape)}-patch input.')
        return self._replace_with_mask_token(x, upsample_mask(mask, grid, cells, hw_shape))
