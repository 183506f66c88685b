"""The evidence run's transfer leg: finetune() converts an MST checkpoint, loads it into Mask
R-CNN's Swin or SETR's ViT, trains a few iterations on rendered scenes and returns the metric.

The MST checkpoints are the evidence run's own models (MaskSwin-nano, ViT-tiny) saved as
``{'state_dict': ...}`` with a teacher that differs from the student, so that a loaded
weight can only have come from the teacher.
"""
from types import SimpleNamespace

import pytest
import torch
from kit_helpers import REPO, scalars
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.optim import build_optim_wrapper
from mmengine.registry import HOOKS, DefaultScope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.errors import UserInputError
from mst_research.data import write_scenes
from mst_research.transfer import TRANSFER_METRICS, FrozenBackbone, finetune

SWIN_CONFIG = REPO / 'projects/mst_research/configs/mst_swin-nano-p4-w4_1xb64-coslr-6e_animals.py'
VIT_CONFIG = REPO / 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py'
DET_CONFIG = REPO / 'projects/mst_research/configs/mask-rcnn_mst-swin-nano_fpn_animal-scenes.py'
SEG_CONFIG = REPO / 'projects/mst_research/configs/setr_mst-vit-tiny_naive_animal-scenes.py'
TEACHER = 'teacher.module.0.'


@HOOKS.register_module(force=True)
class BackboneAfterInitHook(Hook):
    """Records the backbone's tensors when training starts, i.e. after the weights' init."""
    snapshot: dict = {}

    def before_train(self, runner) -> None:
        BackboneAfterInitHook.snapshot = {
            k: v.detach().clone() for k, v in runner.model.backbone.state_dict().items()}


@HOOKS.register_module(force=True)
class TrainingRecordHook(Hook):
    """Records the model's tensors before and after training, the backbone's grads after it,
    and for every training forward of the backbone whether the model was in train mode and
    which of the backbone's modules were."""
    before: dict = {}
    after: dict = {}
    grads: list = []
    modes: list = []

    def before_train(self, runner) -> None:
        cls = TrainingRecordHook
        cls.before = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}
        cls.modes = []
        self.handle = runner.model.backbone.register_forward_pre_hook(
            lambda backbone, args: cls.modes.append(
                {name: m.training for name, m in backbone.named_modules()})
            if runner.model.training else None)

    def after_train(self, runner) -> None:
        self.handle.remove()
        TrainingRecordHook.after = {
            k: v.detach().clone() for k, v in runner.model.state_dict().items()}
        TrainingRecordHook.grads = [p.grad for p in runner.model.backbone.parameters()]


def changed(prefix: str) -> list:
    """The tensors under ``prefix`` that training changed."""
    before, after = TrainingRecordHook.before, TrainingRecordHook.after
    return [k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])]


@pytest.fixture(autouse=True)
def restore_default_scope():
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


@pytest.fixture(scope='module')
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp('scenes')
    write_scenes(str(root), train_scenes=8, val_scenes=4)
    return str(root)


def save_mst_checkpoint(config, path) -> dict:
    """An MST model of ``config`` as ``{'state_dict': ...}``; returns that state dict."""
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(Config.fromfile(str(config)).model)
    model.init_weights()
    with torch.no_grad():
        for param in model.teacher.module.parameters():
            param.add_(torch.randn_like(param) * 1e-2)
    state = model.state_dict()
    torch.save({'state_dict': state}, path)
    return state


def quick(**extra) -> dict:
    """Two iterations at batch 2, validation at the end, every iteration logged."""
    options = dict(
        train_cfg=dict(max_iters=2, val_interval=2),
        train_dataloader=dict(batch_size=2),
        val_dataloader=dict(batch_size=2),
        default_hooks=dict(logger=dict(interval=1)),
        custom_hooks=[dict(type='BackboneAfterInitHook'), dict(type='TrainingRecordHook')],
        log_level='WARNING')
    options.update(extra)
    return options


def assert_last_validation(result: dict, work_dir, target: str) -> None:
    """finetune returns, as plain floats, what the evaluator logged at the end of training."""
    names = TRANSFER_METRICS[target]
    logged = [row for row in scalars(work_dir) if set(names.values()) <= set(row)]
    assert len(logged) == 1   # one validation, at the end
    assert all(type(value) is float for value in result.values())
    assert result == pytest.approx({name: logged[0][key] for name, key in names.items()})


def test_transfer_configs_load():
    for config in (SWIN_CONFIG, DET_CONFIG, SEG_CONFIG):
        cfg = Config.fromfile(str(config))
        assert cfg.custom_imports.imports == ['mst_mm']
    det, seg = Config.fromfile(str(DET_CONFIG)), Config.fromfile(str(SEG_CONFIG))
    swin = Config.fromfile(str(SWIN_CONFIG)).model.backbone
    assert det.model.backbone.embed_dims == swin.arch.embed_dims
    assert det.model.backbone.depths == swin.arch.depths
    assert det.model.backbone.num_heads == swin.arch.num_heads
    assert det.model.backbone.window_size == swin.window_size
    assert det.model.roi_head.bbox_head.num_classes == len(det.metainfo['classes']) == 10
    vit = Config.fromfile(str(VIT_CONFIG)).model.backbone
    assert seg.model.backbone.embed_dims == vit.arch.embed_dims
    assert seg.model.backbone.num_layers == vit.arch.num_layers
    assert seg.model.backbone.num_heads == vit.arch.num_heads
    assert seg.model.backbone.embed_dims * seg.model.backbone.mlp_ratio == \
        vit.arch.feedforward_channels
    assert seg.model.backbone.patch_size == vit.patch_size
    assert seg.model.decode_head.num_classes == len(seg.metainfo['classes']) == 11


def test_swin_nano_pretraining_config_masks_on_a_grid_with_candidates():
    cfg = Config.fromfile(str(SWIN_CONFIG))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.model)
    grid = cfg.model.backbone.img_size // model.backbone.feat_stride
    assert grid * grid // cfg.model.mask_cfg.num >= 2   # some cells are mask candidates


@pytest.mark.slow
def test_mask_rcnn_from_the_mst_teacher(scenes, tmp_path):
    state = save_mst_checkpoint(SWIN_CONFIG, tmp_path / 'swin.pth')
    options = quick(model=dict(test_cfg=dict(rcnn=dict(score_thr=0.0))))
    result = finetune(str(DET_CONFIG), str(tmp_path / 'swin.pth'), str(tmp_path / 'work'),
                      scenes, 0, 'mmdet', options)
    assert_last_validation(result, tmp_path / 'work', 'mmdet')

    after_init = BackboneAfterInitHook.snapshot
    converted = torch.load(tmp_path / 'work' / 'mmdet_backbone.pth')['state_dict']
    teacher = {k[len(TEACHER):]: v for k, v in state.items() if k.startswith(TEACHER)}
    assert set(converted) == {f'backbone.{k}' for k in after_init}
    for key in ('patch_embed.projection.weight', 'stages.0.blocks.0.attn.w_msa.qkv.weight',
                'stages.0.downsample.reduction.weight', 'stages.1.blocks.3.ffn.layers.1.weight',
                'norm1.weight'):
        assert torch.equal(after_init[key], teacher[key]), key
        assert not torch.equal(teacher[key], state[f'backbone.{key}']), key  # not the student


@pytest.mark.slow
def test_setr_from_the_mst_teacher(scenes, tmp_path):
    state = save_mst_checkpoint(VIT_CONFIG, tmp_path / 'vit.pth')
    result = finetune(str(SEG_CONFIG), str(tmp_path / 'vit.pth'), str(tmp_path / 'work'),
                      scenes, 0, 'mmseg', quick())
    assert_last_validation(result, tmp_path / 'work', 'mmseg')

    after_init = BackboneAfterInitHook.snapshot
    teacher = {k[len(TEACHER):]: v for k, v in state.items() if k.startswith(TEACHER)}
    assert torch.equal(after_init['layers.0.attn.attn.in_proj_weight'],
                       teacher['layers.0.attn.qkv.weight'])
    assert torch.equal(after_init['layers.3.attn.attn.out_proj.bias'],
                       teacher['layers.3.attn.proj.bias'])
    assert torch.equal(after_init['patch_embed.projection.bias'],
                       teacher['patch_embed.projection.bias'])
    assert torch.equal(after_init['ln1.weight'], teacher['ln1.weight'])
    # 8 x 8 patches at 32 px, 16 x 16 on the 64-px scenes; the class token's entry is kept.
    width = teacher['cls_token'].shape[-1]
    assert teacher['pos_embed'].shape == (1, 65, width)
    assert after_init['pos_embed'].shape == (1, 257, width)
    assert torch.equal(after_init['pos_embed'][:, 0], teacher['pos_embed'][:, 0])


@pytest.mark.slow
@pytest.mark.parametrize('target, config', [('mmdet', DET_CONFIG), ('mmseg', SEG_CONFIG)])
def test_random_init(target, config, scenes, tmp_path):
    options = quick(model=dict(test_cfg=dict(rcnn=dict(score_thr=0.0)))) \
        if target == 'mmdet' else quick()
    result = finetune(str(config), None, str(tmp_path), scenes, 1, target, options)
    assert_last_validation(result, tmp_path, target)
    assert not (tmp_path / f'{target}_backbone.pth').exists()
    assert DefaultScope.get_current_instance().scope_name == 'mmpretrain'   # given back
    # Without frozen_backbone the backbone trains, in train mode.
    assert changed('backbone.')
    assert len(TrainingRecordHook.modes) == 2
    assert all(all(modes.values()) for modes in TrainingRecordHook.modes)


class Toy(BaseModel):
    """A backbone with dropout and a neck, trained on the mean of their output."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
        self.neck = torch.nn.Linear(4, 1)

    def forward(self, inputs, data_samples=None, mode='loss'):
        return dict(loss=self.neck(self.backbone(inputs)).mean())


@pytest.mark.parametrize('optimizer', [
    dict(type='AdamW', lr=0.1, weight_decay=0.5),
    dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.5)])
def test_frozen_backbone_hook(optimizer):
    """As the runner calls them: the optimizer is built before ``before_train``, and
    ``model.train()`` comes before every ``before_train_iter``."""
    torch.manual_seed(0)
    model = Toy()
    runner = SimpleNamespace(model=model)
    optim_wrapper = build_optim_wrapper(model, dict(optimizer=optimizer))
    backbone = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    neck = {k: v.clone() for k, v in model.neck.state_dict().items()}
    hook = FrozenBackbone()
    hook.before_train(runner)
    for step in range(3):
        model.train()
        hook.before_train_iter(runner, step)
        assert model.training and not any(m.training for m in model.backbone.modules())
        model.train_step(dict(inputs=torch.randn(8, 4)), optim_wrapper)
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, backbone[k]), k
    assert all(p.grad is None for p in model.backbone.parameters())
    assert all(not torch.equal(v, neck[k]) for k, v in model.neck.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize('target, config, vit_or_swin', [
    ('mmdet', DET_CONFIG, SWIN_CONFIG), ('mmseg', SEG_CONFIG, None)])
def test_frozen_backbone(target, config, vit_or_swin, scenes, tmp_path):
    """The backbone (Mask R-CNN's from the MST teacher, SETR's from random init) ends as it
    started, in eval mode at every training forward; the neck and heads train."""
    checkpoint = None
    if vit_or_swin:
        checkpoint = str(tmp_path / 'mst.pth')
        save_mst_checkpoint(vit_or_swin, checkpoint)
    options = quick(model=dict(test_cfg=dict(rcnn=dict(score_thr=0.0)))) \
        if target == 'mmdet' else quick()
    result = finetune(str(config), checkpoint, str(tmp_path / 'work'), scenes, 0, target,
                      options, frozen_backbone=True)
    assert_last_validation(result, tmp_path / 'work', target)

    assert not changed('backbone.')
    assert all(grad is None for grad in TrainingRecordHook.grads)
    heads = {k.partition('.')[0] for k in TrainingRecordHook.before} - {'backbone'}
    assert heads == ({'neck', 'rpn_head', 'roi_head'} if target == 'mmdet'
                     else {'decode_head', 'auxiliary_head'})
    for head in heads:
        assert changed(f'{head}.'), head
    if checkpoint:   # the converted teacher, as loaded
        after_init = BackboneAfterInitHook.snapshot
        converted = torch.load(tmp_path / 'work' / 'mmdet_backbone.pth')['state_dict']
        for key, value in after_init.items():
            assert torch.equal(TrainingRecordHook.after[f'backbone.{key}'], value)
            assert torch.equal(converted[f'backbone.{key}'], value)
    assert len(TrainingRecordHook.modes) == 2
    assert not any(any(modes.values()) for modes in TrainingRecordHook.modes)


def test_refuses_a_checkpoint_of_the_other_backbone(scenes, tmp_path):
    save_mst_checkpoint(VIT_CONFIG, tmp_path / 'vit.pth')
    with pytest.raises(UserInputError, match='use --target mmseg'):
        finetune(str(DET_CONFIG), str(tmp_path / 'vit.pth'), str(tmp_path / 'work'), scenes,
                 0, 'mmdet', quick())
