"""The one reader of trained weights: the model of a config with a checkpoint's weights, or the
teacher's or the student's backbone weights of a checkpoint, read weights-only.

Every tool, probe and converter reads checkpoints through here; the prefixes that say where
MST keeps each network are :data:`~mst_mm.models.algorithms.mst.BACKBONE_PREFIXES`.
"""
import copy
import logging
import os.path as osp
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import DefaultScope
from mmengine.runner import set_random_seed
from mmpretrain.registry import MODELS

from mst_mm.engine.checked_runner import load_checked, state_dict_of
from mst_mm.engine.safe_loading import read_checkpoint
from mst_mm.errors import CheckpointError, UserInputError
from mst_mm.models.algorithms.mst import BACKBONE_PREFIXES, PRETRAIN_ONLY_KEYS


def read_state_dict(checkpoint: str) -> Dict[str, torch.Tensor]:
    """The ``state_dict`` of a checkpoint (or the file itself, if it is a bare state dict),
    read weights-only onto the CPU."""
    return state_dict_of(read_checkpoint(checkpoint, map_location='cpu'), checkpoint)


def read_training_checkpoint(checkpoint: str, out: Optional[str] = None) -> dict:
    """An MST training checkpoint (mmengine's dict with a ``state_dict``), read weights-only;
    refused when it is ``out``, the file a converter is about to write."""
    if out is not None and osp.abspath(out) == osp.abspath(checkpoint):
        raise UserInputError(f'OUT is the input checkpoint {checkpoint}: choose another path, '
                             'the converted file holds only the backbone.')
    loaded = read_checkpoint(checkpoint, map_location='cpu')
    if not isinstance(loaded, dict) or 'state_dict' not in loaded:
        raise CheckpointError(f'{checkpoint} is not an MST training checkpoint: expected a dict '
                              "with a 'state_dict' entry, as mmengine saves.")
    return loaded


def extract_backbone(state_dict: Dict[str, torch.Tensor], weights: str = 'teacher',
                     source: str = 'the checkpoint') -> Dict[str, torch.Tensor]:
    """The ``'teacher'`` (EMA) or ``'student'`` backbone of an MST ``state_dict``, with
    mmpretrain names and without pretraining-only keys; ``source`` names it in errors.

    ``'student'`` reads the ``backbone.*`` keys, which any mmpretrain model has: an MST
    student, or the backbone of a supervised ``ImageClassifier`` of the same network.
    """
    if weights not in BACKBONE_PREFIXES:
        raise UserInputError(f'weights must be one of {sorted(BACKBONE_PREFIXES)}, '
                             f'got {weights!r}.')
    prefix = BACKBONE_PREFIXES[weights]
    if not any(k.startswith(prefix) for k in state_dict):
        raise CheckpointError(
            f"{source} is not an MST training checkpoint: it has no '{prefix}*' keys (the "
            f"{'EMA teacher' if weights == 'teacher' else 'student'}'s backbone). Give the "
            '.pth that tools/train.py wrote for an MST config, e.g. '
            'work_dirs/mst_deit-s-p16_8xb128-coslr-300e_in1k/epoch_300.pth.')
    return {k[len(prefix):]: v for k, v in state_dict.items()
            if k.startswith(prefix) and k[len(prefix):] not in PRETRAIN_ONLY_KEYS}


def backbone_state(checkpoint: str, weights: str = 'teacher') -> Dict[str, torch.Tensor]:
    """One backbone's weights from any file that holds them, under the backbone's own names.

    - an MST training checkpoint: its EMA teacher's backbone (``weights='student'``: the
      student's);
    - a checkpoint whose model keeps its backbone under ``backbone.*`` (a supervised
      classifier);
    - a backbone alone (``tools/model_converters/mst2downstream.py --target mmpretrain``).
    """
    state = read_state_dict(checkpoint)
    if any(k.startswith(BACKBONE_PREFIXES['teacher']) for k in state):
        return extract_backbone(state, weights, checkpoint)
    if any(k.startswith(BACKBONE_PREFIXES['student']) for k in state):
        return extract_backbone(state, 'student', checkpoint)
    return state


@contextmanager
def _quiet_init() -> Iterator[None]:
    """``init_weights`` logs a line per parameter (hundreds) where no runner has a log file."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_model(cfg: Config, checkpoint: Optional[str] = None,
               seed: Optional[int] = None) -> nn.Module:
    """The model of ``cfg`` in eval mode, with every weight of ``checkpoint`` (weights-only,
    strict), or initialised as a fresh run initialises it when ``checkpoint`` is None.

    ``seed`` seeds Python, numpy and torch first (mmengine's ``set_random_seed``), as a run
    with that seed does.
    """
    if seed is not None:
        set_random_seed(seed)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmpretrain')):
        model = MODELS.build(copy.deepcopy(cfg.model))
    if checkpoint is None:
        with _quiet_init():
            model.init_weights()
    else:
        load_checked(model, read_state_dict(checkpoint), checkpoint, "the config's model",
                     'Give a checkpoint that tools/train.py wrote for this config.', strict=True)
    return model.eval()
