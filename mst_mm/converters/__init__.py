"""Checkpoints in and out of MST: the one reader of trained weights (:mod:`.checkpoint`), the
export to mmdet and mmseg (:mod:`.downstream`), DINO's format both ways (:mod:`.dino`) and the
names the other code bases give MST's tensors (:mod:`.names`). Nothing here registers a module,
so ``import mst_mm`` does not import it."""
from .checkpoint import (
    backbone_state,
    extract_backbone,
    load_model,
    read_state_dict,
    read_training_checkpoint,
)
from .dino import convert_dino_checkpoint, mst_to_dino, read_dino_checkpoint
from .downstream import convert_for_downstream
from .names import backbone_kind, vit_to_timm

__all__ = ['backbone_kind', 'backbone_state', 'convert_dino_checkpoint', 'convert_for_downstream',
           'extract_backbone', 'load_model', 'mst_to_dino', 'read_dino_checkpoint',
           'read_state_dict', 'read_training_checkpoint', 'vit_to_timm']
