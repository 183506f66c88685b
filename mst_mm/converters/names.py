"""The names of MST's tensors in the other code bases that share its networks: timm's
VisionTransformer (DINO's ViTs) and DINO's head, for the export (``mst2downstream.py``) and
the import of DINO's weights (``dino2mst.py``)."""
import re
from typing import Dict, List, Tuple

import torch

from mst_mm.errors import CheckpointError, some_keys

# mmpretrain VisionTransformer <-> timm VisionTransformer. Both keep q, k, v stacked in one
# Linear in the same order, and the class token first in pos_embed, so only names change.
# One table serves both directions, so that the two renamings are inverses by construction.
_VIT_TIMM_NAMES: Tuple[Tuple[str, str], ...] = (
    ('cls_token', 'cls_token'),
    ('pos_embed', 'pos_embed'),
    ('patch_embed.projection.{p}', 'patch_embed.proj.{p}'),
    ('layers.{i}.ln1.{p}', 'blocks.{i}.norm1.{p}'),
    ('layers.{i}.ln2.{p}', 'blocks.{i}.norm2.{p}'),
    ('layers.{i}.attn.qkv.{p}', 'blocks.{i}.attn.qkv.{p}'),
    ('layers.{i}.attn.proj.{p}', 'blocks.{i}.attn.proj.{p}'),
    ('layers.{i}.ffn.layers.0.0.{p}', 'blocks.{i}.mlp.fc1.{p}'),
    ('layers.{i}.ffn.layers.1.{p}', 'blocks.{i}.mlp.fc2.{p}'),
    ('ln1.{p}', 'norm.{p}'),  # mmpretrain's final norm
)


def _name_pattern(template: str) -> re.Pattern:
    """A template of ``_VIT_TIMM_NAMES`` as a regex: ``{i}`` a block index, ``{p}`` weight or
    bias."""
    pattern = re.escape(template).replace(r'\{i\}', r'(?P<i>\d+)')
    return re.compile('^' + pattern.replace(r'\{p\}', r'(?P<p>weight|bias)') + '$')


_VIT_TO_TIMM = tuple((_name_pattern(ours), timm) for ours, timm in _VIT_TIMM_NAMES)
_TIMM_TO_VIT = tuple((_name_pattern(timm), ours) for ours, timm in _VIT_TIMM_NAMES)


def _rename(state: Dict[str, torch.Tensor], table) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """``state`` renamed by the first pattern of ``table`` that matches each key (tensors
    shared, not copied), and the keys that none matches."""
    renamed, unknown = {}, []
    for key, value in state.items():
        for pattern, template in table:
            match = pattern.match(key)
            if match:
                renamed[template.format(**match.groupdict())] = value
                break
        else:
            unknown.append(key)
    return renamed, unknown


def backbone_kind(backbone: Dict[str, torch.Tensor]) -> str:
    """``'vit'`` or ``'swin'``, from the names of the backbone's tensors."""
    if 'patch_embed.projection.weight' in backbone and 'layers.0.attn.qkv.weight' in backbone:
        return 'vit'
    if 'stages.0.blocks.0.attn.w_msa.qkv.weight' in backbone:
        return 'swin'
    raise CheckpointError('The checkpoint holds neither an MST ViT (MaskViT) nor an MST Swin '
                          '(MaskSwin) backbone; its first keys are '
                          f'{sorted(backbone)[:5]}.')


def vit_to_timm(backbone: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An mmpretrain ViT's tensors (shared, not copied) under timm's names.

    Loads with ``strict=True`` into ``timm.create_model('vit_small_patch16_224',
    num_classes=0)`` for DeiT-S, as DINO's released backbones do; a tensor without a timm
    counterpart (a layer scale, no class token) is refused by name.
    """
    renamed, unknown = _rename(backbone, _VIT_TO_TIMM)
    missing = [k for k in ('cls_token', 'pos_embed', 'norm.weight') if k not in renamed]
    if unknown or missing:
        raise CheckpointError(
            "The ViT does not have the layout of timm's VisionTransformer: "
            f'tensors without a timm name: {", ".join(sorted(unknown)[:8]) or "none"}; '
            f'timm tensors not provided: {", ".join(missing) or "none"}. The timm export '
            'covers ViTs with a class token, a final norm and no layer scale (DeiT-S: '
            "vit_small_patch16_224); use --target mmpretrain for the others.")
    return renamed


def timm_to_vit(backbone: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A timm VisionTransformer's tensors (shared, not copied) under mmpretrain's names: the
    inverse of :func:`vit_to_timm`.

    Takes the key names of DINO's released ViTs and of ``timm.create_model(
    'vit_small_patch16_224', num_classes=0)``; a classifier (``head.*``) must be dropped by
    the caller. A tensor without an mmpretrain counterpart (a layer scale, register tokens,
    DINOv2's [MASK] token) is refused by name.
    """
    renamed, unknown = _rename(backbone, _TIMM_TO_VIT)
    if unknown:
        raise CheckpointError(
            "The weights do not have the layout of timm's VisionTransformer (DINO's ViT): "
            f"tensors without a counterpart in MST's ViT: {some_keys(sorted(unknown))}. Only "
            'ViTs with a class token, a final norm and no layer scale or register tokens '
            "convert (DINO's ViT-S/16 and ViT-B/16, timm's vit_small_patch16_224 and "
            'vit_base_patch16_224).')
    return renamed


# DINO's head (facebookresearch/dino DINOHead) and our DINONeck share the MLP's index layout
# (Linear[-BN]-GELU per hidden layer, then Linear). The last layer differs in name only:
# DINO weight-normalises it with the old nn.utils.weight_norm (weight_g, weight_v), DINONeck
# with torch.nn.utils.parametrizations.weight_norm (original0 = g, original1 = v), each
# (K, 1) and (K, bottleneck).
_DINO_LAST_LAYER = (('last_layer.weight_g', 'last_layer.parametrizations.weight.original0'),
                    ('last_layer.weight_v', 'last_layer.parametrizations.weight.original1'))
_ONE_LINEAR_MLP = re.compile(r'^mlp\.(weight|bias)$')  # DINOHead with nlayers=1


def dino_head_to_neck(head: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A DINO head's tensors (names after ``head.``) under DINONeck's names.

    ``last_layer.weight_g`` / ``weight_v`` become the weight-norm parametrization's
    ``original0`` / ``original1``; a one-layer head's ``mlp.weight`` becomes ``mlp.0.weight``
    (DINONeck keeps a Sequential). Anything else keeps its name.
    """
    names = dict(_DINO_LAST_LAYER)
    return {names.get(key) or _ONE_LINEAR_MLP.sub(r'mlp.0.\1', key): value
            for key, value in head.items()}


def neck_to_dino_head(neck: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """DINONeck's tensors under the names of DINO's head: the inverse of
    :func:`dino_head_to_neck`."""
    names = {ours: theirs for theirs, ours in _DINO_LAST_LAYER}
    single = all(not k.startswith('mlp.') or k.startswith('mlp.0.') for k in neck)
    return {names.get(key) or (re.sub(r'^mlp\.0\.', 'mlp.', key) if single else key): value
            for key, value in neck.items()}
