"""Backbone-only weights from an MST training checkpoint: mmpretrain names or timm names.

DINO ships its pretrained ViTs as backbone-only state dicts with timm's parameter names, and
mmselfsup's converters wrote backbone-only checkpoints with mmpretrain's names. These
functions give both from an MST checkpoint (the EMA teacher by default, as DINO evaluates),
for ``tools/model_converters/mst2downstream.py`` and its tests.
"""
import re
from typing import Dict, Tuple

import torch

from .errors import UserInputError

SOURCE_PREFIXES = {'teacher': 'teacher.module.0.', 'student': 'backbone.'}
# Parameters that only pretraining uses: the [MASK] token of the student.
PRETRAIN_ONLY_KEYS = ('mask_token', )

# mmpretrain VisionTransformer -> timm VisionTransformer. Both keep q, k, v stacked in one
# Linear in the same order, and the class token first in pos_embed, so only names change.
_VIT_TO_TIMM: Tuple[Tuple[re.Pattern, str], ...] = tuple(
    (re.compile(pattern), replacement) for pattern, replacement in (
        (r'^(cls_token|pos_embed)$', r'\1'),
        (r'^patch_embed\.projection\.(weight|bias)$', r'patch_embed.proj.\1'),
        (r'^layers\.(\d+)\.ln1\.(weight|bias)$', r'blocks.\1.norm1.\2'),
        (r'^layers\.(\d+)\.ln2\.(weight|bias)$', r'blocks.\1.norm2.\2'),
        (r'^layers\.(\d+)\.attn\.qkv\.(weight|bias)$', r'blocks.\1.attn.qkv.\2'),
        (r'^layers\.(\d+)\.attn\.proj\.(weight|bias)$', r'blocks.\1.attn.proj.\2'),
        (r'^layers\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)$', r'blocks.\1.mlp.fc1.\2'),
        (r'^layers\.(\d+)\.ffn\.layers\.1\.(weight|bias)$', r'blocks.\1.mlp.fc2.\2'),
        (r'^ln1\.(weight|bias)$', r'norm.\1'),  # mmpretrain's final norm
    ))


class ConversionError(UserInputError, ValueError):
    """A checkpoint or option that a conversion cannot use; the message says why."""


def extract_backbone(state_dict: Dict[str, torch.Tensor], weights: str = 'teacher',
                     source: str = 'the checkpoint') -> Dict[str, torch.Tensor]:
    """The backbone tensors of the teacher or the student, without pretraining-only keys.

    Args:
        state_dict (dict): An MST training checkpoint's ``state_dict``.
        weights (str): ``'teacher'`` (the EMA teacher) or ``'student'``.
        source (str): The checkpoint's name, for error messages.

    Returns:
        dict: mmpretrain names (``cls_token``, ``layers.0.attn.qkv.weight``, ...).

    Raises:
        ConversionError: ``state_dict`` has no MST teacher, or ``weights`` is unknown.
    """
    if weights not in SOURCE_PREFIXES:
        raise ConversionError(f'weights must be one of {sorted(SOURCE_PREFIXES)}, '
                              f'got {weights!r}.')
    if not any(k.startswith(SOURCE_PREFIXES['teacher']) for k in state_dict):
        raise ConversionError(
            f'{source} is not an MST training checkpoint: it has no '
            f"'{SOURCE_PREFIXES['teacher']}*' keys (the EMA teacher's backbone). Give the "
            '.pth that tools/train.py wrote for an MST config, e.g. '
            'work_dirs/mst_deit-s-p16_8xb128-coslr-300e_in1k/epoch_300.pth.')
    prefix = SOURCE_PREFIXES[weights]
    return {k[len(prefix):]: v for k, v in state_dict.items()
            if k.startswith(prefix) and k[len(prefix):] not in PRETRAIN_ONLY_KEYS}


def backbone_kind(backbone: Dict[str, torch.Tensor]) -> str:
    """``'vit'`` or ``'swin'``, from the names of the backbone's tensors.

    Args:
        backbone (dict): mmpretrain names, as :func:`extract_backbone` returns.

    Returns:
        str: The kind.

    Raises:
        ConversionError: neither an MST ViT nor an MST Swin.
    """
    if 'patch_embed.projection.weight' in backbone and 'layers.0.attn.qkv.weight' in backbone:
        return 'vit'
    if 'stages.0.blocks.0.attn.w_msa.qkv.weight' in backbone:
        return 'swin'
    raise ConversionError('The checkpoint holds neither an MST ViT (MaskViT) nor an MST Swin '
                          '(MaskSwin) backbone; its first keys are '
                          f'{sorted(backbone)[:5]}.')


def vit_to_timm(backbone: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Rename an mmpretrain ViT's tensors to timm's ``VisionTransformer`` names.

    The result loads with ``strict=True`` into ``timm.create_model('vit_small_patch16_224',
    num_classes=0)`` for a DeiT-S backbone (into the timm ViT of the same size otherwise),
    as DINO's released backbone weights do. The tensors are shared, not copied.

    Args:
        backbone (dict): mmpretrain names, as :func:`extract_backbone` returns.

    Returns:
        dict: timm names (``blocks.0.attn.qkv.weight``, ``norm.weight``, ...).

    Raises:
        ConversionError: a tensor has no timm counterpart (a layer scale, a pre-norm, no
            class token), named in the message.
    """
    renamed, unknown = {}, []
    for key, value in backbone.items():
        for pattern, replacement in _VIT_TO_TIMM:
            if pattern.match(key):
                renamed[pattern.sub(replacement, key)] = value
                break
        else:
            unknown.append(key)
    missing = [k for k in ('cls_token', 'pos_embed', 'norm.weight') if k not in renamed]
    if unknown or missing:
        raise ConversionError(
            "The ViT does not have the layout of timm's VisionTransformer: "
            f'tensors without a timm name: {", ".join(sorted(unknown)[:8]) or "none"}; '
            f'timm tensors not provided: {", ".join(missing) or "none"}. The timm export '
            'covers ViTs with a class token, a final norm and no layer scale (DeiT-S: '
            "vit_small_patch16_224); use --target mmpretrain for the others.")
    return renamed
