"""DINO's linear-probe input: CLS tokens of the last blocks, concatenated."""
from typing import Sequence, Tuple

import torch
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS


@MODELS.register_module()
class MultiBlockCLSNeck(BaseModule):
    """Concatenate the CLS tokens of several blocks (DINO's ``n_last_blocks`` protocol).

    Takes the ``out_type='raw'`` outputs of a ViT, e.g. ``MaskViT(out_indices=[8, 9, 10, 11],
    norm_intermediate=True)``, each (B, 1 + N, C), and returns ``(B, len * C)``, plus the
    average of the last block's patch tokens when ``avgpool_patch_tokens`` (DINO uses it for
    ViT-B, not for ViT-S).

    Args:
        avgpool_patch_tokens (bool): Append the mean patch token of the last block.
            Defaults to False.
        num_extra_tokens (int): Tokens before the patches (1: the CLS token).
    """

    def __init__(self, avgpool_patch_tokens: bool = False, num_extra_tokens: int = 1) -> None:
        super().__init__()
        self.avgpool_patch_tokens = avgpool_patch_tokens
        self.num_extra_tokens = num_extra_tokens

    def forward(self, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor]:
        if any(x.dim() != 3 for x in inputs):
            raise ValueError("MultiBlockCLSNeck needs the backbone's out_type='raw' outputs "
                             '(B, 1 + N, C).')
        feats = [x[:, 0] for x in inputs]
        if self.avgpool_patch_tokens:
            feats.append(inputs[-1][:, self.num_extra_tokens:].mean(dim=1))
        return (torch.cat(feats, dim=-1), )
