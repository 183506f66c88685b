"""A frozen backbone that embeds images, for k-NN evaluation of MST checkpoints."""
from typing import List, Optional

import torch
from mmengine.model import BaseModel
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

TEACHER_BACKBONE = 'teacher.module.0.'


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
        source = prefix + (TEACHER_BACKBONE if self.weights == 'teacher' else 'backbone.')
        if not any(k.startswith(prefix + TEACHER_BACKBONE) for k in state_dict):
            return  # not an MST checkpoint: load as it is
        selected = {prefix + 'backbone.' + k[len(source):]: v
                    for k, v in state_dict.items() if k.startswith(source)}
        selected.pop(prefix + 'backbone.mask_token', None)
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
