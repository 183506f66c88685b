"""DINO's checkpoints (facebookresearch/dino) as the start of an MST run, and an MST checkpoint
in DINO's layout (:func:`mst_to_dino`, ``mst2downstream.py --target dino``).

The core of ``tools/model_converters/dino2mst.py``. Three kinds of file are read, weights-only:

- a **backbone-only** file, as DINO releases them (``dino_deitsmall16_pretrain.pth``): the
  teacher's ViT with timm's key names, a bare state dict;
- a **timm ViT** state dict of the same architecture, whose classifier (``head.weight``,
  ``head.bias``) is dropped;
- a **full checkpoint**, as ``main_dino.py`` saves it: ``student`` and ``teacher`` (each the
  ``MultiCropWrapper``'s ``backbone.*`` and ``head.*``, with or without DDP's ``module.``
  prefix) and ``dino_loss`` (the ``center``), beside ``optimizer``, ``epoch`` and ``args``.

The result is an mmengine checkpoint that holds every tensor of the MST model the config
builds, so that ``load_from`` (which the project's runner refuses when it leaves weights out)
starts a run from it with a fresh epoch, optimiser and schedules.
"""
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config

from mst_mm.engine.safe_loading import read_checkpoint
from mst_mm.errors import CheckpointError, UserInputError, some_keys
from mst_mm.models.algorithms.mst import BACKBONE_PREFIXES, NECK_PREFIXES
from mst_mm.utils.cli import merge_cfg_options

from .checkpoint import extract_backbone, load_model
from .names import backbone_kind, dino_head_to_neck, neck_to_dino_head, timm_to_vit, vit_to_timm

# timm's classifier, which DINO's backbones (num_classes=0) do not have.
TIMM_CLASSIFIER = ('head.weight', 'head.bias')
# The EMA's update counter (mmpretrain's CosineEMA, FusedCosineEMA): at 0 the first update
# copies the student into the teacher.
EMA_STEPS_KEY = 'teacher.steps'


@dataclass
class DINOWeights:
    """What a DINO-format file provides.

    Attributes:
        description (str): What the file is, in words, for the log.
        student_backbone (dict): timm names (``cls_token``, ``blocks.0.attn.qkv.weight``...).
        teacher_backbone (dict): The same for the teacher; the student's tensors when the file
            holds one backbone.
        student_head (dict, optional): DINO's head (names after ``head.``), if any.
        teacher_head (dict, optional): The teacher's, likewise.
        center (Tensor, optional): ``dino_loss.center``, (1, K).
        notes (list): What was dropped or stood in for something missing, in words.
    """
    description: str
    student_backbone: Dict[str, torch.Tensor]
    teacher_backbone: Dict[str, torch.Tensor]
    student_head: Optional[Dict[str, torch.Tensor]] = None
    teacher_head: Optional[Dict[str, torch.Tensor]] = None
    center: Optional[torch.Tensor] = None
    notes: List[str] = field(default_factory=list)


def _strip(state: dict, prefix: str) -> dict:
    """``state`` with ``prefix`` taken off the keys that start with it."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


def _tensors(state, what: str, source: str) -> Dict[str, torch.Tensor]:
    """``state`` if it is a non-empty dict of tensors, else a CheckpointError naming ``what``."""
    if not isinstance(state, dict) or not state:
        raise CheckpointError(f'{source}: {what} is {type(state).__name__ if state else "empty"}'
                              ', not a state dict of tensors.')
    others = sorted(str(k) for k, v in state.items() if not isinstance(v, torch.Tensor))
    if others:
        raise CheckpointError(f'{source}: {what} holds entries that are not tensors: '
                              f'{some_keys(others)}. Expected a state dict.')
    return state


def split_wrapper(state: Dict[str, torch.Tensor], what: str,
                  source: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """The backbone and head of a DINO ``MultiCropWrapper`` state dict (DDP's ``module.``
    taken off), each without its ``backbone.`` / ``head.`` prefix."""
    state = _strip(_tensors(state, what, source), 'module.')
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    head = {k[len('head.'):]: v for k, v in state.items() if k.startswith('head.')}
    other = sorted(k for k in state if not k.startswith(('backbone.', 'head.')))
    if other or not backbone:
        raise CheckpointError(
            f"{source}: {what} is not DINO's MultiCropWrapper (backbone.* and head.*): "
            + ('it has no backbone.* keys.' if not backbone else
               f'other keys: {some_keys(other)}.'))
    return backbone, head


def read_dino_checkpoint(filename: str) -> DINOWeights:
    """Read a DINO backbone-only file, full checkpoint or timm ViT state dict, weights-only.

    A full checkpoint gives the student from ``student`` and the teacher from ``teacher``;
    when it holds only one of them, both come from it. A bare state dict is one backbone (or
    one ``MultiCropWrapper``, if its keys say ``backbone.*``), which both take.
    """
    # main_dino.py saves its command line (`args`, an argparse.Namespace) in every full
    # checkpoint: read_checkpoint gives it as a dict of its values.
    loaded = read_checkpoint(filename, map_location='cpu')
    if not isinstance(loaded, dict):
        raise CheckpointError(f'{filename} holds a {type(loaded).__name__}, not a checkpoint '
                              'dict: expected a DINO checkpoint or a timm ViT state dict.')

    if 'student' in loaded or 'teacher' in loaded:
        wrappers = {name: split_wrapper(loaded[name], f"its '{name}'", filename)
                    for name in ('student', 'teacher') if name in loaded}
        notes = []
        if len(wrappers) == 1:
            (only, _), = wrappers.items()
            notes.append(f"the file holds only the {only}: student and teacher both start "
                         'from it')
        student = wrappers.get('student', wrappers.get('teacher'))
        teacher = wrappers.get('teacher', student)
        loss = loaded.get('dino_loss')
        center = loss.get('center') if isinstance(loss, dict) else None
        if center is not None and not isinstance(center, torch.Tensor):
            raise CheckpointError(f"{filename}: dino_loss['center'] is not a tensor.")
        kind = 'DINO full checkpoint' + (f' (epoch {loaded["epoch"]})'
                                         if isinstance(loaded.get('epoch'), int) else '')
        return DINOWeights(kind, student[0], teacher[0], student[1] or None,
                           teacher[1] or None, center, notes)

    state = loaded
    if isinstance(state.get('state_dict'), dict):
        if any(str(k).startswith('teacher.module.') for k in state['state_dict']):
            raise UserInputError(
                f'{filename} is already an MST checkpoint: start from it with '
                f'--cfg-options load_from={filename}, or continue its run with --resume.')
        state = state['state_dict']   # timm's training script, mmengine
    elif isinstance(state.get('model'), dict):
        state = state['model']        # DeiT's released checkpoints
    state = _strip(_tensors(state, 'the state dict', filename), 'module.')
    if any(k.startswith('backbone.') for k in state):  # one MultiCropWrapper, saved alone
        backbone, head = split_wrapper(state, 'the state dict', filename)
        return DINOWeights("DINO MultiCropWrapper state dict (one network: student and "
                           'teacher both start from it)', backbone, backbone, head or None,
                           head or None)
    notes = []
    dropped = [k for k in TIMM_CLASSIFIER if k in state]
    if dropped:
        state = {k: v for k, v in state.items() if k not in TIMM_CLASSIFIER}
        notes.append(f"dropped timm's classifier ({', '.join(dropped)}): MST's projection "
                     'head replaces it')
    kind = 'timm ViT state dict' if dropped else 'DINO backbone-only file (timm names)'
    return DINOWeights(kind, state, state, notes=notes)


def fresh_model(cfg: Config) -> torch.nn.Module:
    """The config's model on the CPU, initialised as a fresh run initialises it.

    The random draws use the config's seed (``randomness.seed``, else 0) in a forked random
    state, so a conversion is reproducible and leaves the caller's generators untouched.
    """
    seed = (cfg.get('randomness') or {}).get('seed')
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if seed is None else seed)
        return load_model(cfg)


def _vit_size(state: Dict[str, torch.Tensor]) -> str:
    """A timm-named ViT's size in words: width, blocks, position tokens."""
    width = state['cls_token'].shape[-1] if 'cls_token' in state else '?'
    blocks = len({k.split('.')[1] for k in state if k.startswith('blocks.')})
    tokens = state['pos_embed'].shape[1] if 'pos_embed' in state else '?'
    return f'{width} wide, {blocks} blocks, {tokens} position tokens'


def _check_backbone(given: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor],
                    role: str, source: str) -> None:
    """Refuse, by key and shape, a ViT that differs from the config's (both timm names)."""
    missing = [k for k in expected if k not in given]
    unexpected = sorted(set(given) - set(expected))
    mismatched = [f'{k} {tuple(given[k].shape)} in the file, {tuple(expected[k].shape)} in '
                  'the config' for k in expected if k in given
                  and given[k].shape != expected[k].shape]
    if not (missing or unexpected or mismatched):
        return
    parts = [f'{label}: {some_keys(keys, 6)}' for label, keys in (
        ('shape mismatches', mismatched), ('missing from the file', missing),
        ('not in the config', unexpected)) if keys]
    raise CheckpointError(
        f"The {role} of {source} does not fit the config's ViT ({_vit_size(given)} in the "
        f'file, {_vit_size(expected)} in the config): {"; ".join(parts)}. Pass the --config '
        "whose ViT has the file's size and input size: the DeiT-S configs for ViT-S/16, "
        'configs/mst/mst_vit-base-p16_8xb128-coslr-100e_in1k.py for ViT-B/16 (224 px, '
        '16-px patches).')


def _head_fits(head: Optional[Dict[str, torch.Tensor]],
               expected: Dict[str, torch.Tensor]) -> Optional[str]:
    """None if ``head`` (DINONeck names) fits the config's neck exactly, else why not."""
    if head is None:
        return 'the file has no DINO head'
    missing = sorted(set(expected) - set(head))
    unexpected = sorted(set(head) - set(expected))
    mismatched = sorted(f'{k} {tuple(head[k].shape)} vs {tuple(expected[k].shape)}'
                        for k in set(head) & set(expected) if head[k].shape != expected[k].shape)
    if not (missing or unexpected or mismatched):
        return None
    parts = [f'{label} {some_keys(keys, 3)}' for label, keys in (
        ('only in the config', missing), ('only in the file', unexpected),
        ('shapes (file vs config)', mismatched)) if keys]
    return "the file's DINO head has another layout than the config's neck (" + \
        '; '.join(parts) + ')'


def dino_to_mst(weights: DINOWeights, model: torch.nn.Module, source: str = 'the file'
                ) -> Tuple[Dict[str, torch.Tensor], List[str], List[str]]:
    """The state dict of ``model`` (an MST model, freshly initialised) with DINO's weights in.

    - The student's backbone (``backbone.*``) and the teacher's (``teacher.module.0.*``) come
      from the file's student and teacher; a backbone that does not fit is refused by key and
      shape.
    - DINO's head goes to the neck (``neck.*``, ``teacher.module.1.*``) and its centre to
      ``head.center`` when the config's neck has exactly the head's layout; otherwise the
      neck and the centre stay as the fresh model has them.
    - What DINO has no counterpart for (the [MASK] token, the image decoder) stays fresh.
    - When the file's teacher differs from its student, the EMA's update counter starts at 1:
      at 0, the first update would copy the student over the teacher.

    Returns:
        tuple: The state dict (every key of ``model``), what was carried over and what was
        initialised as in a fresh run, in words.
    """
    state = {k: v.clone() for k, v in model.state_dict().items()}
    teacher_backbone, teacher_neck = model.teacher.module
    expected_backbone = teacher_backbone.state_dict()
    try:
        expected_timm = vit_to_timm(expected_backbone)
    except CheckpointError:
        raise UserInputError(
            f"The config's backbone ({type(teacher_backbone).__name__}) is not a ViT with "
            "timm's layout: DINO's ViT weights need a ViT config, such as "
            'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py.') from None
    carried, fresh = [], []
    two = weights.student_backbone is not weights.teacher_backbone
    for role, given in (('student', weights.student_backbone),
                        ('teacher', weights.teacher_backbone)):
        prefix = BACKBONE_PREFIXES[role]
        _check_backbone(given, expected_timm, f'{role} backbone' if two else 'backbone',
                        source)
        state.update({prefix + k: v.to(state[prefix + k].dtype)
                      for k, v in timm_to_vit(given).items()})
    carried.append(f'the ViT ({len(expected_timm)} tensors: ' + (
        "student <- the file's student, teacher <- the file's teacher)" if two else
        'student and teacher <- the same weights)'))

    heads = {role: None if head is None else dino_head_to_neck(head)
             for role, head in (('student', weights.student_head),
                                ('teacher', weights.teacher_head))}
    expected_neck = teacher_neck.state_dict()
    why_not = _head_fits(heads['student'], expected_neck) or \
        _head_fits(heads['teacher'], expected_neck)
    if why_not is None:
        for role, head in heads.items():
            prefix = NECK_PREFIXES[role]
            state.update({prefix + k: v.to(state[prefix + k].dtype) for k, v in head.items()})
        carried.append(f'DINO head -> neck ({len(expected_neck)} tensors each)')
        center = weights.center
        if center is not None and center.shape == state['head.center'].shape:
            state['head.center'] = center.float()
            carried.append('centre -> head.center')
        else:
            fresh.append('the centre (head.center: ' + (
                'the file has none' if center is None else
                f'{tuple(center.shape)} in the file, {tuple(state["head.center"].shape)} here')
                + ')')
    else:
        fresh.append(f'the projection neck (neck.*, teacher.module.1.*: {why_not}) and the '
                     'centre (head.center)')

    names = set(model.state_dict())
    if 'backbone.mask_token' in names:
        fresh.insert(0, 'the [MASK] token (backbone.mask_token)')
    decoder = [k for k in names if k.startswith('decoder_head.')]
    if decoder:
        fresh.append(f'the image decoder (decoder_head.*, {len(decoder)} tensors)')
    # A fresh model's teacher holds the student's values from before init_weights re-drew
    # the student: a fresh run's first EMA update copies the student over it. Here that
    # copy may be skipped (below), so a neck that the file does not provide is copied now.
    student_key = {**{BACKBONE_PREFIXES['teacher'] + k: BACKBONE_PREFIXES['student'] + k
                      for k in expected_backbone},
                   **{NECK_PREFIXES['teacher'] + k: NECK_PREFIXES['student'] + k
                      for k in expected_neck}}
    if why_not is not None:
        for key in expected_neck:
            state[NECK_PREFIXES['teacher'] + key] = state[NECK_PREFIXES['student'] + key].clone()
    differ = [k for k, s in student_key.items() if not torch.equal(state[k], state[s])]
    if EMA_STEPS_KEY in state and differ:
        state[EMA_STEPS_KEY] = torch.ones_like(state[EMA_STEPS_KEY])
        carried.append("the teacher as the file's own (the EMA's step count starts at 1, so "
                       'its first update averages instead of copying the student over it)')
    assert set(state) == names  # every key of the model, none more: load_from needs it
    return state, carried, fresh


def convert_dino_checkpoint(checkpoint: str, out: str, config, cfg_options: Optional[dict] = None,
                            log: Optional[Callable[[str], None]] = print
                            ) -> Dict[str, torch.Tensor]:
    """Convert a DINO-format ``checkpoint`` for the MST model of ``config`` and write ``out``.

    Args:
        checkpoint (str): A DINO backbone-only file, full checkpoint or timm ViT state dict.
        out (str): Where to write ``dict(state_dict=..., meta=...)`` for ``load_from``.
        config (Config | str): The MST config that the run will use.
        cfg_options (dict, optional): Overrides merged into the config, as the run's
            ``--cfg-options``.
        log (callable, optional): Receives what was done (default ``print``); None is silent.

    Returns:
        dict: The written state dict.
    """
    if osp.abspath(out) == osp.abspath(checkpoint):
        raise UserInputError(f'OUT is the input checkpoint {checkpoint}: choose another path.')
    weights = read_dino_checkpoint(checkpoint)
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    if cfg_options:
        merge_cfg_options(cfg, cfg_options)
    if (cfg.get('model') or {}).get('type') != 'MST':
        raise UserInputError(f'{config if isinstance(config, str) else cfg.filename} is not an '
                             'MST pretraining config (model type MST): give the config of the '
                             'run that will start from the weights.')
    state, carried, fresh = dino_to_mst(weights, fresh_model(cfg), checkpoint)
    config_name = osp.abspath(config) if isinstance(config, str) else cfg.filename
    meta = dict(source=osp.abspath(checkpoint), source_format=weights.description,
                config=config_name, carried=carried, fresh=fresh)
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    torch.save(dict(state_dict=state, meta=meta), out)
    if log is not None:
        log(f'Read {checkpoint}: {weights.description}.')
        for note in weights.notes:
            log(f'  {note}')
        log(f'Carried over: {"; ".join(carried)}.')
        log(f'Initialised as in a fresh run: {"; ".join(fresh) or "nothing"}.')
        shown = osp.relpath(config_name) if config_name else 'the given config'
        options = ''.join(f' {k}={v}' for k, v in (cfg_options or {}).items())
        log(f'Wrote {out} ({len(state)} tensors, every one of the model of {shown}). Start '
            f'with: python tools/train.py {shown} --cfg-options load_from={out}{options}')
    return state


def mst_to_dino(state_dict: Dict[str, torch.Tensor],
                source: str = 'the checkpoint') -> Dict[str, dict]:
    """An MST ViT training state dict in the layout of DINO's full checkpoints.

    ``student`` and ``teacher`` hold ``backbone.*`` (timm names, as DINO's
    ``VisionTransformer``) and ``head.*`` (DINO's head), and ``dino_loss`` the centre, so that
    DINO's ``eval_knn.py`` and ``eval_linear.py`` read the teacher with ``--checkpoint_key
    teacher`` and ``main_dino.py`` can restart from it. The student's keys carry DDP's
    ``module.`` prefix and the teacher's only when the head has BatchNorm, as
    ``main_dino.py`` saves them: its restart loads with ``strict=False``, so a prefix it does
    not expect would load nothing, silently. The [MASK] token and the image decoder have no
    place in DINO's format and are left out; so are the optimiser and the epoch (DINO
    restarts at epoch 0 with its own optimiser).
    """
    student = extract_backbone(state_dict, 'student', source)
    teacher = extract_backbone(state_dict, 'teacher', source)
    if backbone_kind(teacher) != 'vit':
        raise UserInputError(f"DINO's format holds ViTs, but {source} holds an MST Swin "
                             'backbone: use --target mmpretrain (or mmdet for Mask R-CNN).')
    necks = {name: {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
             for name, prefix in NECK_PREFIXES.items()}
    if not necks['student'] or not necks['teacher'] or 'head.center' not in state_dict:
        raise CheckpointError(f'{source} has no DINO head (neck.*, teacher.module.1.*) or '
                              'no centre (head.center): it is not an MST checkpoint of a '
                              'model with DINONeck and DINODistillHead.')
    with_bn = any(k.endswith('running_mean') for k in necks['teacher'])
    prefixes = dict(student='module.', teacher='module.' if with_bn else '')
    saved = {}
    for name, backbone in (('student', student), ('teacher', teacher)):
        saved[name] = {
            **{f'{prefixes[name]}backbone.{k}': v for k, v in vit_to_timm(backbone).items()},
            **{f'{prefixes[name]}head.{k}': v
               for k, v in neck_to_dino_head(necks[name]).items()}}
    saved['dino_loss'] = dict(center=state_dict['head.center'])
    return saved
