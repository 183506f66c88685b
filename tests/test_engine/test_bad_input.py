"""A checkpoint that cannot be used ends a tool with one message naming it and the fix:

* k-NN / linear probe: a checkpoint that does not provide the backbone's weights (a partial
  one only when asked);
* ``--resume``: a file that is not a training checkpoint, or a truncated one (also for the
  converter).

The tools' ``main()`` runs in this process; ``tests/test_tools/test_bad_input_cli.py`` checks once,
in a
subprocess, that such an error becomes status 2 without a traceback.
"""
import re

import pytest
import torch
from mmengine.config import Config
from mmpretrain.models import ResNet, VisionTransformer
from mmpretrain.registry import MODELS
from torch import nn

from mst_mm.engine import CheckedPretrainedInit, check_training_checkpoint, load_checked
from mst_mm.errors import CheckpointError
from tests.helpers import DEMO_CONFIG, REPO, load_tool, make_image_folder

KNN_CONFIG = str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py')
PROBE_CONFIG = str(REPO / 'configs/benchmarks/classification/'
                   'linear_deit-s_cls-last_8xb128-100e_in1k.py')
TEACHER = 'teacher.module.0.'


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> str:
    return make_image_folder(tmp_path_factory.mktemp('bad_input') / 'data', classes=2,
                             per_class=4)


def knn_args(checkpoint, data_root, work_dir, *extra) -> list:
    return [KNN_CONFIG, str(checkpoint), '--work-dir', str(work_dir), *extra, '--cfg-options',
            f'test_dataloader.dataset.data_root={data_root}',
            f'test_cfg.train_dataloader.dataset.data_root={data_root}']


def demo_vit() -> VisionTransformer:
    """The backbone of the k-NN demo config (54 tensors)."""
    return VisionTransformer(arch=dict(embed_dims=96, num_layers=4, num_heads=4,
                                       feedforward_channels=384), img_size=32, patch_size=4)


def test_knn_eval_refuses_a_checkpoint_of_another_model(data_root, tmp_path):
    checkpoint = tmp_path / 'resnet18.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in
                               ResNet(depth=18).state_dict().items()}}, checkpoint)
    with pytest.raises(CheckpointError) as refused:
        load_tool('tools/analysis/knn_eval.py').main(knn_args(checkpoint, data_root,
                                                              tmp_path / 'work'))
    for fragment in (f'{checkpoint} provides none of the 54 weights',
                     'backbone: 54 of 54 tensors (cls_token, ', 'not a checkpoint of this model'):
        assert fragment in str(refused.value)


def test_knn_eval_loads_a_partial_checkpoint_only_when_asked(data_root, tmp_path, capfd):
    partial = tmp_path / 'partial.pth'
    torch.save({'state_dict': {TEACHER + k: v for k, v in demo_vit().state_dict().items()
                               if not k.startswith('layers.3.')}}, partial)
    tool = load_tool('tools/analysis/knn_eval.py')
    with pytest.raises(CheckpointError) as refused:
        tool.main(knn_args(partial, data_root, tmp_path / 'work'))
    for fragment in (f'{partial} provides 42 of the 54 weights',
                     'backbone: 12 of 54 tensors (layers.3.', '--allow-partial'):
        assert fragment in str(refused.value)

    tool.main(knn_args(partial, data_root, tmp_path / 'work', '--allow-partial'))
    output = ''.join(capfd.readouterr())
    assert 'Partial load allowed' in output and '|   k | top-1 (%) |' in output


def test_linear_probe_refuses_a_pretrained_checkpoint_that_loads_nothing(tmp_path):
    # mmengine's Pretrained init would load none of these keys and train the probe on a
    # randomly initialised DeiT-S without an error.
    checkpoint = tmp_path / 'resnet18_teacher.pth'
    torch.save({'state_dict': {TEACHER + k: v for k, v in
                               ResNet(depth=18).state_dict().items()}}, checkpoint)
    backbone_cfg = Config.fromfile(PROBE_CONFIG).model.backbone
    backbone_cfg.init_cfg.checkpoint = str(checkpoint)
    with pytest.raises(CheckpointError) as refused:
        MODELS.build(backbone_cfg).init_weights()
    for fragment in (f'{checkpoint} provides none of the 150 weights of the MaskViT',
                     'top level: 2 of 2 tensors (cls_token, pos_embed)', 'The file holds bn1.'):
        assert fragment in str(refused.value)


def tiny_vit(**init):
    return VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                                       feedforward_channels=64), img_size=32, patch_size=8,
                             **init)


def test_checked_pretrained_init_loads_all_or_what_it_is_allowed_to(tmp_path):
    from mmengine.model.weight_init import PretrainedInit
    from mmengine.registry import WEIGHT_INITIALIZERS, DefaultScope, build_from_cfg

    source = tiny_vit()
    full, partial = tmp_path / 'full.pth', tmp_path / 'partial.pth'
    torch.save({'state_dict': {TEACHER + k: v for k, v in source.state_dict().items()}}, full)
    torch.save({'state_dict': {TEACHER + k: v for k, v in source.state_dict().items()
                               if not k.startswith('layers.1.')}}, partial)

    target = tiny_vit()
    CheckedPretrainedInit(str(full), prefix=TEACHER)(target)
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value, rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r'layers: 12 of 24 tensors \(1\.'):
        CheckedPretrainedInit(str(partial), prefix=TEACHER)(tiny_vit())
    CheckedPretrainedInit(str(partial), prefix=TEACHER, allow_partial=True)(tiny_vit())
    with pytest.raises(CheckpointError, match="no weights under the prefix 'x.'"):
        CheckedPretrainedInit(str(full), prefix='x', allow_partial=True)(tiny_vit())
    # Configs ask for it by its own name; 'Pretrained' stays mmengine's for everyone else.
    # MaskViT keeps the loaded pos_embed after it as after 'Pretrained'.
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        built = build_from_cfg(dict(type='CheckedPretrained', checkpoint=str(full)),
                               WEIGHT_INITIALIZERS)
        plain = build_from_cfg(dict(type='Pretrained', checkpoint=str(full)),
                               WEIGHT_INITIALIZERS)
    assert isinstance(built, CheckedPretrainedInit)
    assert type(plain) is PretrainedInit
    from mst_mm.models import MaskViT
    loaded = MaskViT(arch=dict(embed_dims=32, num_layers=2, num_heads=4,
                               feedforward_channels=64), img_size=32, patch_size=8,
                     use_mask_token=False,
                     init_cfg=dict(type='CheckedPretrained', checkpoint=str(full),
                                   prefix=TEACHER))
    loaded.init_weights()
    torch.testing.assert_close(loaded.pos_embed, source.pos_embed, rtol=0, atol=0)


def test_load_checked_names_missing_weights_and_shape_mismatches():
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    with pytest.raises(CheckpointError) as refused:
        load_checked(net, {'0.weight': torch.zeros(4, 2), '0.bias': torch.ones(3)}, 'f.pth',
                     'the net', 'FIX.')
    assert str(refused.value) == ('f.pth does not fit the net: 0.weight is (4, 2) in the '
                                  'checkpoint and (3, 2) in the model. FIX.')
    partial = {'0.weight': torch.full((3, 2), 2.0), '0.bias': torch.ones(3),
               'extra.1.weight': torch.zeros(3)}
    with pytest.raises(CheckpointError) as refused:
        load_checked(net, partial, 'f.pth', 'the net', 'FIX.', partial_hint='PARTIAL.')
    assert str(refused.value) == (
        'f.pth provides 2 of the 6 weights of the net; not loaded, so left randomly '
        'initialised: 1: 4 of 4 tensors (bias, running_mean, running_var, weight). FIX. '
        'PARTIAL.')
    load_checked(net, partial, 'f.pth', 'the net', 'FIX.', allow_partial=True)  # a warning
    assert torch.equal(net[0].weight, torch.full((3, 2), 2.0))
    with pytest.raises(CheckpointError, match='extra.1.weight'):
        load_checked(net, {**net.state_dict(), 'extra.1.weight': torch.zeros(3)}, 'f.pth',
                     'the net', 'FIX.', strict=True)


def train_args(work_dir, *extra) -> list:
    return [DEMO_CONFIG, '--work-dir', str(work_dir), *map(str, extra)]


def test_resume_from_a_file_that_is_not_a_training_checkpoint_names_it(tmp_path):
    checkpoint = tmp_path / 'weights.pth'
    torch.save({'a': torch.randn(3, 3)}, checkpoint)
    with pytest.raises(CheckpointError) as refused:
        load_tool('tools/train.py').main(train_args(tmp_path / 'work', '--resume', checkpoint))
    assert (f'Cannot resume from {checkpoint}: it is not an mmengine training checkpoint '
            "(it has no 'meta'") in str(refused.value)
    assert f'load_from={checkpoint}' in str(refused.value)
    assert not (tmp_path / 'work').exists()

    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': {'epoch': 1}}, checkpoint)
    with pytest.raises(CheckpointError, match="no 'message_hub'"):
        check_training_checkpoint(str(checkpoint))


def test_resume_and_convert_name_a_truncated_checkpoint(tmp_path):
    checkpoint = tmp_path / 'epoch_2.pth'
    state = {TEACHER + k: v for k, v in demo_vit().state_dict().items()}
    torch.save({'state_dict': state, 'meta': {'epoch': 2, 'iter': 4}, 'message_hub': {}},
               checkpoint)
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[:len(data) // 2])
    message = f'Cannot read checkpoint {checkpoint}: the file is truncated'
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_tool('tools/train.py').main(train_args(tmp_path / 'work', '--resume', checkpoint))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_tool('tools/model_converters/mst2downstream.py').main(
            [str(checkpoint), str(tmp_path / 'out.pth'), '--target', 'mmseg'])
    assert not (tmp_path / 'out.pth').exists()
