"""A ViT that takes MST's mask and returns the teacher's CLS attention (Eq. 5, Eq. 7)."""
from contextlib import nullcontext
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_
from mmpretrain.models import VisionTransformer
from mmpretrain.models.utils import resize_pos_embed
from mmpretrain.registry import MODELS

from ..utils.precision import at_least_float32, float32_region
from .mask_token import MaskTokenMixin


class MSTFeatures(NamedTuple):
    """What MST needs from one backbone pass.

    Attributes:
        global_feat (Tensor): (B, C), the image embedding fed to the projection neck.
        feat_map (Tensor | None): (B, C, h, w), patch features on the mask grid, for the
            decoder; None when ``forward_mst`` was asked for no patches.
        attn (Tensor | None): (B, h * w), the guidance for the mask rule, when asked for.
        attn_heads (Tensor | None): (B, heads, h * w), the same per head, for pictures.
        grid (tuple): (h, w), the mask grid.
    """
    global_feat: torch.Tensor
    feat_map: Optional[torch.Tensor]
    attn: Optional[torch.Tensor]
    attn_heads: Optional[torch.Tensor]
    grid: Tuple[int, int]


def encoder_layer_with_cls_attention(layer: nn.Module, x: torch.Tensor, cls_only: bool = False,
                                     with_attn: bool = True
                                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    r"""Run one mmpretrain ``TransformerEncoderLayer`` and also return its CLS attention.

    The layer output is computed with the fused ``F.scaled_dot_product_attention`` exactly as
    the layer's own forward does. Only the CLS row of the attention matrix is formed
    explicitly, which costs O(N) instead of O(N^2) (Eq. 5):

    .. math::
        Attn = \frac{1}{H}\sum_{h=1}^{H}
               \mathrm{Softmax}\Big(Q_h^{cls}\cdot\frac{K_h^T}{\sqrt d}\Big)

    With ``cls_only`` only the CLS token's output is computed. It depends on the other
    tokens through their keys and values alone, so for the N patches the layer forms keys
    and values (2 of the 12 C^2 multiply-adds per token of a ViT block) and skips their
    queries, projection and MLP: in the last layer, where nothing reads the patches, the
    same CLS output for about a sixth of the work.

    Returns:
        tuple: The layer output, (B, 1 + N, C), or (B, 1, C) with ``cls_only``; and, with
        ``with_attn``, the CLS-to-patch attention of each head, (B, heads, N), taken over all
        keys and then restricted to the patches (as DINO does), whose mean over heads is
        Eq. 5, in float32 under any autocast (else None).
    """
    attn = layer.attn
    h = layer.ln1(x)
    batch, tokens, _ = h.shape
    # The guidance ranks the patches for the mask: with it, the projections and the scores
    # run in float32 whatever the autocast context (in bfloat16 the ranking would compare
    # 8-bit scores). Only the attention output below is left to autocast.
    with float32_region(h.device) if with_attn else nullcontext():
        if with_attn:
            h = at_least_float32(h)
        if cls_only:
            if attn.v_shortcut:
                raise ValueError('cls_only needs a layer without v_shortcut (whose output '
                                 'adds every token\'s value).')
            # The qkv projection's first C outputs are the queries: only the CLS token's.
            weight, bias = attn.qkv.weight, attn.qkv.bias
            channels = attn.embed_dims
            q = F.linear(h[:, :1], weight[:channels],
                         None if bias is None else bias[:channels])
            q = q.reshape(batch, 1, attn.num_heads, attn.head_dims).transpose(1, 2)
            kv = F.linear(h, weight[channels:], None if bias is None else bias[channels:])
            k, v = kv.reshape(batch, tokens, 2, attn.num_heads,
                              attn.head_dims).permute(2, 0, 3, 1, 4)
            x = x[:, :1]
        else:
            qkv = attn.qkv(h).reshape(batch, tokens, 3, attn.num_heads, attn.head_dims)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
        cls_attn = None
        if with_attn:
            with torch.no_grad():
                scores = (q[:, :, :1] @ k.transpose(-2, -1)) * attn.head_dims**-0.5
                cls_attn = scores.softmax(dim=-1)[:, :, 0, 1:]
    dropout_p = attn.attn_drop if attn.training else 0.
    out = attn.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    out = out.transpose(1, 2).reshape(batch, q.shape[2], attn.embed_dims)
    out = attn.out_drop(attn.gamma1(attn.proj_drop(attn.proj(out))))
    if attn.v_shortcut:
        out = v.squeeze(1) + out
    x = x + out
    x = layer.ffn(layer.ln2(x), identity=x)
    return x, cls_attn


POS_EMBED_RESIZE_RULES = ('size', 'dino')


def dino_resize_pos_embed(pos_embed: torch.Tensor,
                          src_shape: Sequence[int],
                          dst_shape: Sequence[int],
                          mode: str = 'bicubic',
                          num_extra_tokens: int = 1) -> torch.Tensor:
    """Resize a position embedding by DINO's rule (``interpolate_pos_encoding``).

    DINO does not ask ``F.interpolate`` for the target size but for the scale factor
    ``(dst + 0.1) / src`` on each side. The 0.1 only guards ``floor(src * scale)`` against
    rounding down to ``dst - 1``; but with an explicit scale factor, the kernel samples the
    source at ``(i + 0.5) / scale - 0.5``, so the grid is also read over ``dst / (dst + 0.1)``
    of its extent, anchored at the top-left. mmpretrain's :func:`resize_pos_embed` asks for
    the size and reads the whole extent. A grid equal to the source is returned as is, as
    both rules do.

    Args:
        pos_embed (Tensor): (1, num_extra_tokens + src_h * src_w, C).
        src_shape (Sequence[int]): (src_h, src_w), the grid the embedding was made for.
        dst_shape (Sequence[int]): (dst_h, dst_w), the patch grid of the input.
        mode (str): Interpolation mode; DINO uses ``'bicubic'``. Defaults to ``'bicubic'``.
        num_extra_tokens (int): Leading tokens (CLS) that are not resized. Defaults to 1.

    Returns:
        Tensor: (1, num_extra_tokens + dst_h * dst_w, C).
    """
    src_h, src_w = src_shape
    dst_h, dst_w = dst_shape
    if (src_h, src_w) == (dst_h, dst_w):
        return pos_embed
    channels = pos_embed.shape[-1]
    extra_tokens = pos_embed[:, :num_extra_tokens]
    grid = pos_embed[:, num_extra_tokens:].reshape(1, src_h, src_w, channels).permute(0, 3, 1, 2)
    # Bicubic interpolation needs float32, as in mmpretrain's resize_pos_embed.
    resized = F.interpolate(grid.float(), scale_factor=((dst_h + 0.1) / src_h,
                                                        (dst_w + 0.1) / src_w),
                            mode=mode, align_corners=False)
    if tuple(resized.shape[-2:]) != (dst_h, dst_w):
        raise RuntimeError(f'DINO-rule interpolation of a {src_h} x {src_w} grid gave '
                           f'{tuple(resized.shape[-2:])}, not {(dst_h, dst_w)}.')
    resized = resized.flatten(2).transpose(1, 2).to(pos_embed.dtype)
    return torch.cat((extra_tokens, resized), dim=1)


@MODELS.register_module()
class MaskViT(MaskTokenMixin, VisionTransformer):
    r"""mmpretrain's ``VisionTransformer`` with MST's [MASK] embedding and CLS attention.

    The mask replaces patch embeddings after the linear projection and before the position
    embedding is added (paper appendix; Eq. 7):

    .. math::
        (\mathbf m \odot \mathbf e)_i = [\mathrm{MASK}] \text{ if } m_i = 1 \text{ else } e_i

    With its defaults, a ``MaskViT`` is mmpretrain's ViT plus the [MASK] parameter:
    ``forward``, initialisation and checkpoint loading are the parent's, so a trained
    ``MaskViT`` serves kNN, linear probing and the converters like any mmpretrain ViT; MST
    calls :meth:`forward_mst`, the only method that needs the CLS token.

    **Initialisation.** mmpretrain leaves ``qkv`` and ``proj`` at PyTorch's default
    (uniform, std about 0.029 for 384 channels, non-zero biases), gives the FFN Xavier
    weights, and a zero CLS token. ``dino_init=True`` initialises as DINO's
    ``VisionTransformer`` does: every ``nn.Linear`` truncated normal with std 0.02 (cut at
    +-2, absolute, so in effect untruncated) and zero bias, every LayerNorm weight 1 and bias
    0, CLS token and position embedding truncated normal with std 0.02; the patch-embedding
    convolution keeps PyTorch's default. This cannot be a config-level ``init_cfg``: mmengine
    applies a module's ``init_cfg`` before its children's ``init_weights``, and mmpretrain's
    ``TransformerEncoderLayer.init_weights`` then re-draws the FFN with Xavier. With a
    ``Pretrained`` ``init_cfg`` the checkpoint decides and nothing is re-drawn.

    **Position embedding of other resolutions** (``pos_embed_resize``). The embedding is
    learnt for ``img_size`` (14 x 14 patches at 224 px) and is interpolated bicubically for
    other inputs, such as 96-px local crops (6 x 6):

    - ``'size'`` (default, mmpretrain's ``resize_pos_embed``): interpolate to the target
      size. Patch centre i of n samples the 14 x 14 grid at the same relative position,
      (i + 0.5) / n, over the whole grid.
    - ``'dino'`` (:func:`dino_resize_pos_embed`): DINO's ``interpolate_pos_encoding``,
      which passes ``scale_factor=(n + 0.1) / 14``. The 0.1 is a guard against a rounding
      error in the output size (DINO issue #8), but it also sets the sampling positions,
      (i + 0.5) / (n + 0.1): the grid is read over n / (n + 0.1) of its extent from the
      top-left corner (98 % at 96 px). At 96 px, on a smooth embedding of magnitude 0.1,
      the two differ by up to 0.022, along the bottom row and right column.

    The configs keep ``'size'``: it is geometrically consistent (the crop spans the whole
    grid, symmetrically), and it is the rule of everything that later reads the weights at
    another size: mmpretrain's checkpoint loading and forward, mmseg's ViT (SETR at
    768 px) and ``tools/model_converters/mst2downstream.py`` all resize by size (mmdet's
    benchmark uses Swin-T, which has no absolute position embedding). ``'dino'`` is there
    to replicate DINO's, and so presumably the paper's, pretraining exactly; it changes
    only inputs whose patch grid differs from ``img_size``'s (the 224-px global crops are
    untouched either way).

    Args:
        use_mask_token (bool): Create the learnable [MASK] embedding. The student has one;
            the teacher does not need it. Defaults to True.
        norm_intermediate (bool): Apply the final LayerNorm to every output of
            ``out_indices``, as DINO's ``get_intermediate_layers`` does for its linear probe
            on the last blocks. Defaults to False (mmpretrain's behaviour).
        dino_init (bool): Initialise as DINO does (see above). Defaults to False
            (mmpretrain's initialisation).
        pos_embed_resize (str): ``'size'`` (mmpretrain) or ``'dino'`` (see above).
            Defaults to ``'size'``.
        **kwargs: The arguments of mmpretrain's ``VisionTransformer``; every combination
            it accepts is accepted (``with_cls_token=False`` too, but then
            :meth:`forward_mst` is unavailable).
    """

    def __init__(self, *args, use_mask_token: bool = True, norm_intermediate: bool = False,
                 dino_init: bool = False, pos_embed_resize: str = 'size', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if norm_intermediate and not self.final_norm:
            raise ValueError('norm_intermediate=True needs final_norm=True.')
        if pos_embed_resize not in POS_EMBED_RESIZE_RULES:
            raise ValueError(f'Unknown pos_embed_resize {pos_embed_resize!r}: choose one of '
                             f'{POS_EMBED_RESIZE_RULES}.')
        self.norm_intermediate = norm_intermediate
        self.dino_init = dino_init
        self.pos_embed_resize = pos_embed_resize
        self._create_mask_token(use_mask_token)

    @property
    def feat_stride(self) -> int:
        """Pixels per patch: the decoder must upsample the patch map by this factor."""
        return self.patch_embed.projection.stride[0]

    def init_weights(self) -> None:
        """mmpretrain's initialisation, then DINO's where ``dino_init`` asks for it."""
        super().init_weights()
        if self.dino_init and not self._init_cfg_loads_checkpoint():
            self._init_weights_as_dino()

    def _init_weights_as_dino(self) -> None:
        # Runs after every child's init_weights, so nothing re-draws these afterwards; the
        # [MASK] token keeps the mixin's truncated normal.
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        trunc_normal_(self.pos_embed, std=.02)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=.02)

    def _resize_pos_embed(self, patch_resolution: Tuple[int, int]) -> torch.Tensor:
        resize = dino_resize_pos_embed if self.pos_embed_resize == 'dino' else resize_pos_embed
        return resize(self.pos_embed, self.patch_resolution, patch_resolution,
                      mode=self.interpolate_mode, num_extra_tokens=self.num_extra_tokens)

    def _embed(self, x: torch.Tensor,
               mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Patch embedding, [MASK] replacement, CLS token, position embedding."""
        batch = x.shape[0]
        x, patch_resolution = self.patch_embed(x)
        if mask is not None:
            x = self._replace_with_mask_token(x, mask)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(batch, -1, -1), x), dim=1)
        x = x + self._resize_pos_embed(patch_resolution)
        return self.pre_norm(self.drop_after_pos(x)), patch_resolution

    def forward(self, x: torch.Tensor) -> tuple:
        """mmpretrain's forward; with ``norm_intermediate`` every output is final-normed.

        With both options at their defaults this is the parent's own ``forward``.
        """
        if not self.norm_intermediate and self.pos_embed_resize == 'size':
            return super().forward(x)
        x, patch_resolution = self._embed(x)
        outs = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == last and self.final_norm:
                x = self.ln1(x)
            if i in self.out_indices:
                # The running tokens stay un-normed: only the outputs are.
                out = self.ln1(x) if self.norm_intermediate and i != last else x
                outs.append(self._format_output(out, patch_resolution))
        return tuple(outs)

    def forward_mst(self,
                    x: torch.Tensor,
                    mask: Optional[torch.Tensor] = None,
                    with_attn: bool = False,
                    with_patches: bool = True) -> MSTFeatures:
        """One pass that returns the CLS token, the patch map and, optionally, the attention.

        Args:
            x (Tensor): Images, (B, 3, H, W).
            mask (BoolTensor, optional): (B, N), True where the patch becomes [MASK].
            with_attn (bool): Also return the last layer's CLS-to-patch attention.
            with_patches (bool): Also return the patch map. Without it the last layer runs
                for the CLS token only (:func:`encoder_layer_with_cls_attention`), the same
                CLS output for less work: MST's teacher and local crops read nothing else.

        Returns:
            MSTFeatures: ``global_feat`` is the final-normed CLS token.
        """
        if self.cls_token is None:
            raise ValueError('MaskViT.forward_mst needs the CLS token, which this backbone was '
                             'built without: MST feeds the CLS token to the projection neck '
                             'and guides the mask with its attention. Build it with '
                             '`with_cls_token=True`.')
        batch = x.shape[0]
        x, patch_resolution = self._embed(x, mask)

        *early_layers, last_layer = self.layers
        for layer in early_layers:
            x = layer(x)
        if with_attn or not with_patches:
            x, attn_heads = encoder_layer_with_cls_attention(
                last_layer, x, cls_only=not with_patches, with_attn=with_attn)
        else:
            x, attn_heads = last_layer(x), None
        if self.final_norm:
            x = self.ln1(x)

        feat_map = None
        if with_patches:
            patches = x[:, self.num_extra_tokens:]
            feat_map = patches.transpose(1, 2).reshape(batch, -1, *patch_resolution)
        attn = attn_heads.mean(dim=1) if attn_heads is not None else None
        return MSTFeatures(x[:, 0], feat_map, attn, attn_heads, tuple(patch_resolution))
