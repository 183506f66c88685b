"""A ViT that takes MST's mask and returns the teacher's CLS attention (Eq. 5, Eq. 7)."""
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
from mmpretrain.models import VisionTransformer
from mmpretrain.models.utils import resize_pos_embed
from mmpretrain.registry import MODELS

from .mask_token import MaskTokenMixin


class MSTFeatures(NamedTuple):
    """What MST needs from one backbone pass.

    Attributes:
        global_feat (Tensor): (B, C), the image embedding fed to the projection neck.
        feat_map (Tensor): (B, C, h, w), patch features on the mask grid, for the decoder.
        attn (Tensor | None): (B, h * w), the guidance for the mask rule, when asked for.
        attn_heads (Tensor | None): (B, heads, h * w), the same per head, for pictures.
    """
    global_feat: torch.Tensor
    feat_map: torch.Tensor
    attn: Optional[torch.Tensor]
    attn_heads: Optional[torch.Tensor] = None


def encoder_layer_with_cls_attention(layer: nn.Module,
                                     x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Run one mmpretrain ``TransformerEncoderLayer`` and also return its CLS attention.

    The layer output is computed with the fused ``F.scaled_dot_product_attention`` exactly as
    the layer's own forward does. Only the CLS row of the attention matrix is formed
    explicitly, which costs O(N) instead of O(N^2) (Eq. 5):

    .. math::
        Attn = \frac{1}{H}\sum_{h=1}^{H}
               \mathrm{Softmax}\Big(Q_h^{cls}\cdot\frac{K_h^T}{\sqrt d}\Big)

    Returns:
        tuple: The layer output (B, 1 + N, C) and the CLS-to-patch attention of each head,
        (B, heads, N), taken over all keys and then restricted to the patches (as DINO
        does); its mean over heads is Eq. 5.
    """
    attn = layer.attn
    h = layer.ln1(x)
    batch, tokens, _ = h.shape
    qkv = attn.qkv(h).reshape(batch, tokens, 3, attn.num_heads, attn.head_dims)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    dropout_p = attn.attn_drop if attn.training else 0.
    out = attn.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    out = out.transpose(1, 2).reshape(batch, tokens, attn.embed_dims)
    out = attn.out_drop(attn.gamma1(attn.proj_drop(attn.proj(out))))
    if attn.v_shortcut:
        out = v.squeeze(1) + out
    x = x + out
    x = layer.ffn(layer.ln2(x), identity=x)

    with torch.no_grad():
        scores = (q[:, :, :1].float() @ k.float().transpose(-2, -1)) * attn.head_dims**-0.5
        cls_attn = scores.softmax(dim=-1)[:, :, 0, 1:]
    return x, cls_attn


@MODELS.register_module()
class MaskViT(MaskTokenMixin, VisionTransformer):
    r"""mmpretrain's ``VisionTransformer`` with MST's [MASK] embedding and CLS attention.

    The mask replaces patch embeddings after the linear projection and before the position
    embedding is added (paper appendix; Eq. 7):

    .. math::
        (\mathbf m \odot \mathbf e)_i = [\mathrm{MASK}] \text{ if } m_i = 1 \text{ else } e_i

    ``forward`` is unchanged, so a trained ``MaskViT`` serves kNN, linear probing and the
    converters like any mmpretrain ViT; MST calls :meth:`forward_mst`.

    Args:
        use_mask_token (bool): Create the learnable [MASK] embedding. The student has one;
            the teacher does not need it. Defaults to True.
        norm_intermediate (bool): Apply the final LayerNorm to every output of
            ``out_indices``, as DINO's ``get_intermediate_layers`` does for its linear probe
            on the last blocks. Defaults to False (mmpretrain's behaviour).
        **kwargs: The arguments of mmpretrain's ``VisionTransformer``.
    """

    def __init__(self, *args, use_mask_token: bool = True, norm_intermediate: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if norm_intermediate and not self.final_norm:
            raise ValueError('norm_intermediate=True needs final_norm=True.')
        self.norm_intermediate = norm_intermediate
        if not self.with_cls_token:
            raise ValueError('MaskViT needs `with_cls_token=True`: MST guides the mask with the '
                             'CLS attention and feeds the CLS token to the projection neck.')
        self._create_mask_token(use_mask_token)

    @property
    def feat_stride(self) -> int:
        """Pixels per patch: the decoder must upsample the patch map by this factor."""
        return self.patch_embed.projection.stride[0]

    def _embed(self, x: torch.Tensor,
               mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Patch embedding, [MASK] replacement, CLS token, position embedding."""
        batch = x.shape[0]
        x, patch_resolution = self.patch_embed(x)
        if mask is not None:
            x = self._replace_with_mask_token(x, mask)

        x = torch.cat((self.cls_token.expand(batch, -1, -1), x), dim=1)
        x = x + resize_pos_embed(
            self.pos_embed,
            self.patch_resolution,
            patch_resolution,
            mode=self.interpolate_mode,
            num_extra_tokens=self.num_extra_tokens)
        return self.pre_norm(self.drop_after_pos(x)), patch_resolution

    def forward(self, x: torch.Tensor) -> tuple:
        """mmpretrain's forward; with ``norm_intermediate`` every output is final-normed."""
        if not self.norm_intermediate:
            return super().forward(x)
        x, patch_resolution = self._embed(x)
        outs = []
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i in self.out_indices:
                outs.append(self._format_output(self.ln1(x), patch_resolution))
        return tuple(outs)

    def forward_mst(self,
                    x: torch.Tensor,
                    mask: Optional[torch.Tensor] = None,
                    with_attn: bool = False) -> MSTFeatures:
        """One pass that returns the CLS token, the patch map and, optionally, the attention.

        Args:
            x (Tensor): Images, (B, 3, H, W).
            mask (BoolTensor, optional): (B, N), True where the patch becomes [MASK].
            with_attn (bool): Also return the last layer's CLS-to-patch attention.

        Returns:
            MSTFeatures: ``global_feat`` is the final-normed CLS token.
        """
        batch = x.shape[0]
        x, patch_resolution = self._embed(x, mask)

        attn_heads = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if with_attn and i == last:
                x, attn_heads = encoder_layer_with_cls_attention(layer, x)
            else:
                x = layer(x)
        if self.final_norm:
            x = self.ln1(x)

        patches = x[:, self.num_extra_tokens:]
        feat_map = patches.transpose(1, 2).reshape(batch, -1, *patch_resolution)
        attn = attn_heads.mean(dim=1) if attn_heads is not None else None
        return MSTFeatures(x[:, 0], feat_map, attn, attn_heads)
