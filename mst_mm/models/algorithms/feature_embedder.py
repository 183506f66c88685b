"""A frozen backbone that embeds images, for k-NN evaluation of MST checkpoints.

The one place where images are normalised and embedded: ``FeatureEmbedder`` for configs
(``tools/analysis/knn_eval.py``), :func:`embed_images` for a backbone held in memory (the
k-NN probe hook, the evidence run), :func:`forward_normalised` for the rest of a backbone's
outputs.
"""
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

from .mst import BACKBONE_PREFIXES, PRETRAIN_ONLY_KEYS


def forward_normalised(backbone: nn.Module, batches: Iterable[torch.Tensor],
                        mean: Sequence[float], std: Sequence[float], bgr_to_rgb: bool = False,
                        **forward_kwargs) -> Iterator:
    """``backbone.forward_mst`` of each batch, normalised as in training,
    :math:`(x - mean) / std`, in eval mode (the backbone's mode is put back at the end)."""
    device = next(backbone.parameters()).device
    mean = torch.as_tensor(mean, dtype=torch.float, device=device).reshape(1, -1, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float, device=device).reshape(1, -1, 1, 1)
    was_training = backbone.training
    backbone.eval()
    for images in batches:
        images = images.to(device).float()
        if bgr_to_rgb:
            images = images[:, [2, 1, 0]]
        yield backbone.forward_mst((images - mean) / std, **forward_kwargs)
    backbone.train(was_training)


@torch.no_grad()
def embed_images(backbone: nn.Module, batches: Iterable[torch.Tensor], mean: Sequence[float],
                 std: Sequence[float], bgr_to_rgb: bool = False,
                 with_attn: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Embeddings (N, C) of (B, 3, H, W) image batches, normalised as in training,
    :math:`(x - mean) / std`, by an MST backbone's ``forward_mst`` in eval mode; with
    ``with_attn`` also its guidance (N, n), for a ViT the last layer's CLS attention."""
    feats, attns = [], []
    for out in forward_normalised(backbone, batches, mean, std, bgr_to_rgb,
                                   with_attn=with_attn):
        feats.append(out.global_feat.cpu())
        attns.append(out.attn.cpu() if with_attn else None)
    return torch.cat(feats), (torch.cat(attns) if with_attn else None)


@MODELS.register_module()
class FeatureEmbedder(BaseModel):
    """Backbone (-> neck) -> embedding, written into each ``DataSample``: the CLS token of a
    ViT, or a Swin's last-stage map pooled by a neck such as ``GlobalAveragePooling``.

    Loads an MST training checkpoint directly (``load_from`` or ``tools/test.py``): with
    ``weights='teacher'`` (DINO's practice, the default) the EMA teacher's backbone is used,
    with ``'student'`` the student's.

    Args:
        backbone (dict): An mmpretrain backbone; its last output is (B, C) unless a neck
            reduces it.
        neck (dict, optional): Applied to the backbone's outputs (mmpretrain's neck
            interface, a tuple in and out); its last output is the embedding.
        weights (str): ``'teacher'`` or ``'student'``. Defaults to ``'teacher'``.
        data_preprocessor (dict, optional): Defaults to ``ClsDataPreprocessor``.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(self, backbone: dict, neck: Optional[dict] = None, weights: str = 'teacher',
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        if weights not in ('teacher', 'student'):
            raise ValueError(f"weights must be 'teacher' or 'student', got {weights!r}.")
        data_preprocessor = dict(type='ClsDataPreprocessor', **(data_preprocessor or {}))
        super().__init__(data_preprocessor=MODELS.build(data_preprocessor), init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)
        self.neck = MODELS.build(neck) if neck is not None else None
        self.weights = weights
        self._register_load_state_dict_pre_hook(self._select_mst_backbone)

    def _select_mst_backbone(self, state_dict: dict, prefix: str, *args) -> None:
        """Keep only the chosen backbone of an MST checkpoint, renamed to ``backbone.``."""
        source = prefix + BACKBONE_PREFIXES[self.weights]
        if not any(k.startswith(prefix + BACKBONE_PREFIXES['teacher']) for k in state_dict):
            return  # not an MST checkpoint: load as it is
        selected = {prefix + 'backbone.' + k[len(source):]: v
                    for k, v in state_dict.items() if k.startswith(source)}
        for key in PRETRAIN_ONLY_KEYS:
            selected.pop(prefix + 'backbone.' + key, None)
        state_dict.clear()
        state_dict.update(selected)

    def forward(self, inputs: torch.Tensor, data_samples: Optional[List[DataSample]] = None,
                mode: str = 'tensor'):
        feats = self.backbone(inputs)
        if self.neck is not None:
            feats = self.neck(feats)
        feats = feats[-1]
        if mode == 'tensor':
            return feats
        if mode == 'predict':
            for sample, feat in zip(data_samples, feats):
                sample.set_field(feat, 'embedding')
            return data_samples
        raise RuntimeError(f'FeatureEmbedder only supports "tensor" and "predict", got {mode!r}.')
