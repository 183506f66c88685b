"""Check, when MST is built, that the widths of backbone, neck, head and decoder agree.

A mismatch would otherwise surface at the first iteration as a bare tensor error
(``mat1 and mat2 shapes cannot be multiplied``), after the data pipeline has started and
without a word about which config key is wrong. The widths are read from the built
modules, so a default the config leaves out is checked too.
"""
from typing import List, Optional

import torch.nn as nn


class ChannelMismatchError(ValueError):
    """Parts of a model whose widths do not fit; the message names the config keys."""


def backbone_channels(backbone: nn.Module) -> Optional[int]:
    """Channels of the features a backbone gives MST (the pooled feature and the map).

    Args:
        backbone (nn.Module): ``MaskViT`` (its ``embed_dims``) or ``MaskSwin`` (its last
            stage's width), or any module with ``num_features`` or ``embed_dims``.

    Returns:
        int | None: None when the width cannot be read.
    """
    # Swin's ``embed_dims`` is the first stage's width; MST reads the last stage, whose
    # width mmpretrain keeps in ``num_features`` (out_after_downsample=False, as MaskSwin
    # requires).
    num_features = getattr(backbone, 'num_features', None)
    if isinstance(num_features, (list, tuple)) and num_features:
        return int(num_features[-1])
    embed_dims = getattr(backbone, 'embed_dims', None)
    return int(embed_dims) if isinstance(embed_dims, int) else None


def describe_backbone(backbone: nn.Module, cfg: Optional[dict] = None) -> str:
    """``'MaskViT deit-small'``, ``'MaskSwin tiny'`` or ``'MaskViT with a custom arch'``.

    Args:
        backbone (nn.Module): The built backbone.
        cfg (dict, optional): Its config, for the ``arch`` name.

    Returns:
        str: The class name and the arch.
    """
    arch = (cfg or {}).get('arch')
    name = type(backbone).__name__
    return f'{name} {arch}' if isinstance(arch, str) else f'{name} with a custom arch'


def _linears(module: nn.Module) -> List[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _first_conv(module: nn.Module) -> Optional[nn.Conv2d]:
    return next((m for m in module.modules() if isinstance(m, nn.Conv2d)), None)


def channel_mismatches(backbone: nn.Module, neck: nn.Module, head: nn.Module,
                       decoder_head: Optional[nn.Module] = None,
                       backbone_cfg: Optional[dict] = None) -> List[str]:
    """Every width that does not fit its neighbour, each with the config key that fixes it.

    Checked: the backbone's width against ``neck.in_channels`` and
    ``decoder_head.in_channels``, and the neck's prototypes (``neck.out_channels``) against
    the head's ``out_channels`` (the size of its centre). A part whose width cannot be
    read is not checked.

    Args:
        backbone (nn.Module): The student backbone.
        neck (nn.Module): The projection neck (``DINONeck``: its first and last Linear).
        head (nn.Module): The loss head (``DINODistillHead``: its ``center`` buffer).
        decoder_head (nn.Module, optional): The image decoder (its first convolution).
        backbone_cfg (dict, optional): The backbone's config, to name its arch.

    Returns:
        List[str]: One sentence per mismatch; empty when everything fits.
    """
    problems = []
    channels = backbone_channels(backbone)
    what = f'the backbone ({describe_backbone(backbone, backbone_cfg)}) outputs'
    linears = _linears(neck)
    if channels is not None and linears and linears[0].in_features != channels:
        problems.append(
            f'model.neck.in_channels={linears[0].in_features} but {what} {channels} '
            f'channels: set model.neck.in_channels={channels}.')
    center = getattr(head, 'center', None)
    if linears and center is not None and center.shape[-1] != linears[-1].out_features:
        prototypes, head_out = linears[-1].out_features, center.shape[-1]
        problems.append(
            f'model.head.out_channels={head_out} but model.neck.out_channels={prototypes} '
            f'(the number of prototypes): set model.head.out_channels={prototypes} (or '
            f'model.neck.out_channels={head_out}).')
    conv = _first_conv(decoder_head) if decoder_head is not None else None
    if channels is not None and conv is not None and conv.in_channels != channels:
        problems.append(
            f'model.decoder_head.in_channels={conv.in_channels} but {what} {channels} '
            f'channels: set model.decoder_head.in_channels={channels}.')
    return problems
