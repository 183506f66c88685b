"""Checkpoints in and out of MST: the one reader of trained weights (:mod:`.checkpoint`), the
export to mmdet, mmseg, timm and DINO (:mod:`.downstream`) and the import of DINO's weights
(:mod:`.dino`). Nothing here registers a module, so ``import mst_mm`` does not import it."""
from .checkpoint import backbone_state, extract_backbone, load_backbone, load_model, read_state_dict
from .dino import convert_dino_checkpoint, read_dino_checkpoint
from .downstream import convert_for_downstream, mst_to_dino, vit_to_timm

__all__ = ['backbone_state', 'convert_dino_checkpoint', 'convert_for_downstream',
           'extract_backbone', 'load_backbone', 'load_model', 'mst_to_dino',
           'read_dino_checkpoint', 'read_state_dict', 'vit_to_timm']
