"""Bad input to the command-line tools ends with one message that names it and the fix.

Every case runs the tool as a user does (a subprocess) and checks the exit status 2, the
message on stderr, and that no traceback is printed:

* k-NN / test / linear probe: a checkpoint that does not provide the backbone's weights;
* ``--resume``: a file that is not a training checkpoint, a truncated one, and auto-resume
  falling back to the previous good checkpoint;
* ``--cfg-options``: bad syntax and unknown keys;
* a moved or copied work dir resumes from its own checkpoints.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from mst_mm.engine import (
    CheckedPretrainedInit,
    ConfigOptionError,
    IncompleteCheckpointError,
    NotATrainingCheckpointError,
    check_cfg_options,
    check_training_checkpoint,
    merge_cfg_options,
    read_checkpoint,
    read_last_checkpoint,
)
from tests.helpers import DEMO_CONFIG, REPO, make_image_folder

KNN_CONFIG = str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py')
PROBE_CONFIG = str(REPO / 'configs/benchmarks/classification/'
                   'linear_deit-s_cls-last_8xb128-100e_in1k.py')
TEACHER = 'teacher.module.0.'


def run(tool: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / tool), *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr[-4000:]


def train_args(data_root, work_dir, *extra, epochs=2, options=()) -> list:
    return ['tools/train.py', DEMO_CONFIG, '--work-dir', work_dir, *extra, '--cfg-options',
            f'train_dataloader.dataset.data_root={data_root}', 'train_dataloader.batch_size=4',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            f'train_cfg.max_epochs={epochs}', 'default_hooks.checkpoint.interval=1',
            'default_hooks.checkpoint.max_keep_ckpts=3', *options]


def knn_args(checkpoint, data_root, work_dir, *extra) -> list:
    return ['tools/analysis/knn_eval.py', KNN_CONFIG, checkpoint, '--work-dir', work_dir,
            *extra, '--cfg-options', f'test_dataloader.dataset.data_root={data_root}',
            f'test_cfg.train_dataloader.dataset.data_root={data_root}']


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> str:
    return make_image_folder(tmp_path_factory.mktemp('bad_input') / 'data', classes=2,
                             per_class=4)


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory, data_root):
    """A 2-epoch demo run with epoch_1.pth and epoch_2.pth; tests work on copies."""
    work_dir = tmp_path_factory.mktemp('bad_input') / 'run'
    result = run(*train_args(data_root, work_dir))
    assert result.returncode == 0, result.stderr[-4000:]
    return work_dir


def truncate(path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return data[:len(data) // 2]


def resnet18_state_dict(prefix: str) -> dict:
    from mmpretrain.models import ResNet
    return {prefix + k: v for k, v in ResNet(depth=18).state_dict().items()}


# --- 1. a checkpoint that does not provide the backbone's weights -------------------------

@pytest.mark.parametrize('content', ['unrelated', 'resnet18'])
def test_knn_eval_refuses_a_checkpoint_without_the_backbones_weights(content, data_root,
                                                                      tmp_path):
    checkpoint = tmp_path / f'{content}.pth'
    torch.save({'a': torch.randn(3, 3)} if content == 'unrelated' else
               {'state_dict': resnet18_state_dict('backbone.')}, checkpoint)
    result = run(*knn_args(checkpoint, data_root, tmp_path / 'work'))
    assert_refused(result, f'{checkpoint} provides none of the 54 weights',
                   'backbone: 54 of 54 tensors (cls_token, ', 'not a checkpoint of this model')
    assert 'top-1' not in result.stdout


def test_knn_eval_loads_a_partial_checkpoint_only_when_asked(trained_run, data_root, tmp_path):
    state = read_checkpoint(str(trained_run / 'epoch_2.pth'))['state_dict']
    partial = tmp_path / 'partial.pth'
    torch.save({'state_dict': {k: v for k, v in state.items()
                               if not k.startswith(TEACHER + 'layers.3.')}}, partial)
    refused = run(*knn_args(partial, data_root, tmp_path / 'work'))
    assert_refused(refused, f'{partial} provides 42 of the 54 weights',
                   'backbone: 12 of 54 tensors (layers.3.', '--allow-partial')

    allowed = run(*knn_args(partial, data_root, tmp_path / 'work', '--allow-partial'))
    assert allowed.returncode == 0, allowed.stderr[-4000:]
    assert 'Partial load allowed' in allowed.stdout + allowed.stderr
    assert '|   k | top-1 (%) |' in allowed.stdout


def test_knn_eval_refuses_a_checkpoint_of_another_model(data_root, tmp_path):
    checkpoint = tmp_path / 'resnet18.pth'
    torch.save({'state_dict': resnet18_state_dict('backbone.')}, checkpoint)
    assert_refused(run(*knn_args(checkpoint, data_root, tmp_path / 'work')),
                   f'{checkpoint} provides none of the 54 weights')


def test_tools_test_py_sends_a_knn_config_to_the_knn_tool(data_root, tmp_path):
    result = run('tools/test.py', KNN_CONFIG, tmp_path / 'c.pth', '--work-dir',
                 tmp_path / 'work')
    assert_refused(result, 'is a k-NN config: run it with the k-NN tool',
                   f'tools/analysis/knn_eval.py {KNN_CONFIG} {tmp_path / "c.pth"}')
    assert not (tmp_path / 'work').exists()


def test_linear_probe_refuses_a_pretrained_checkpoint_that_loads_nothing(data_root, tmp_path):
    # mmengine's Pretrained init would load none of these keys and train the probe on a
    # randomly initialised DeiT-S without an error.
    checkpoint = tmp_path / 'resnet18_teacher.pth'
    torch.save({'state_dict': resnet18_state_dict(TEACHER)}, checkpoint)
    config = tmp_path / 'probe.py'
    config.write_text(
        f'_base_ = [{PROBE_CONFIG!r}]\n'
        'train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,\n'
        '    pin_memory=False, dataset=dict(_delete_=True, type="CustomDataset",\n'
        f'    data_root={data_root!r}, pipeline={{{{_base_.train_pipeline}}}}))\n'
        'train_cfg = dict(max_epochs=1)\n')
    result = run('tools/train.py', config, '--work-dir', tmp_path / 'work', '--no-validate',
                 '--cfg-options', f'model.backbone.init_cfg.checkpoint={checkpoint}')
    assert_refused(result, f'{checkpoint} provides none of the 150 weights of the MaskViT',
                   'top level: 2 of 2 tensors (cls_token, pos_embed)', 'The file holds bn1.')


def tiny_vit(**init):
    from mmpretrain.models import VisionTransformer
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
    with pytest.raises(IncompleteCheckpointError, match=r'layers: 12 of 24 tensors \(1\.'):
        CheckedPretrainedInit(str(partial), prefix=TEACHER)(tiny_vit())
    CheckedPretrainedInit(str(partial), prefix=TEACHER, allow_partial=True)(tiny_vit())
    with pytest.raises(IncompleteCheckpointError, match="no weights under the prefix 'x.'"):
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


# --- 4. --resume from a file that cannot be resumed ---------------------------------------

def test_resume_from_a_file_that_is_not_a_training_checkpoint_names_it(data_root, tmp_path):
    checkpoint = tmp_path / 'weights.pth'
    torch.save({'a': torch.randn(3, 3)}, checkpoint)
    result = run(*train_args(data_root, tmp_path / 'work', '--resume', checkpoint))
    assert_refused(result, f'Cannot resume from {checkpoint}: it is not an mmengine training '
                   "checkpoint (it has no 'meta'", f'load_from={checkpoint}')

    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': {'epoch': 1}}, checkpoint)
    with pytest.raises(NotATrainingCheckpointError, match="no 'message_hub'"):
        check_training_checkpoint(str(checkpoint))


def test_resume_and_convert_name_a_truncated_checkpoint(trained_run, data_root, tmp_path):
    checkpoint = tmp_path / 'epoch_2.pth'
    shutil.copy(trained_run / 'epoch_2.pth', checkpoint)
    truncate(checkpoint)
    message = f'Cannot read checkpoint {checkpoint}: the file is truncated'
    assert_refused(run(*train_args(data_root, tmp_path / 'work', '--resume', checkpoint)),
                   message)
    assert_refused(run('tools/model_converters/mst2downstream.py', checkpoint,
                       tmp_path / 'out.pth', '--target', 'mmseg'), message)
    assert not (tmp_path / 'out.pth').exists()


def test_auto_resume_falls_back_to_the_previous_good_checkpoint(trained_run, data_root,
                                                                tmp_path):
    work_dir = tmp_path / 'run'
    shutil.copytree(trained_run, work_dir)
    cut = truncate(work_dir / 'epoch_2.pth')
    result = run(*train_args(data_root, work_dir, '--resume'))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f'Cannot read checkpoint {work_dir / "epoch_2.pth"}: the file is truncated' in output
    assert f'falls back to the previous good checkpoint, {work_dir / "epoch_1.pth"}' in output
    assert 'resumed epoch: 1' in output
    check_training_checkpoint(str(work_dir / 'epoch_2.pth'))      # epoch 2 trained again
    assert (work_dir / 'epoch_2.pth.previous').read_bytes() == cut  # the bad file is kept

    truncate(work_dir / 'epoch_1.pth')
    truncate(work_dir / 'epoch_2.pth')
    assert_refused(run(*train_args(data_root, work_dir, '--resume')),
                   'found no earlier good checkpoint', '--resume PATH')


# --- 6. --cfg-options ----------------------------------------------------------------------

@pytest.mark.parametrize('option, fragments', [
    ('model.mask_cfg.p', ['no "=" in \'model.mask_cfg.p\'', 'KEY=VALUE']),
    ('model.mask_cfg.p=[0.1',
     ["unbalanced brackets in the value of model.mask_cfg.p: '[0.1'", 'KEY=[a,b]']),
])
def test_bad_cfg_options_name_the_option_and_the_expected_form(option, fragments, data_root,
                                                                tmp_path):
    args = train_args(data_root, tmp_path / 'work', epochs=1, options=[option])
    assert_refused(run(*args), *fragments)
    assert not (tmp_path / 'work').exists()


def test_cfg_options_add_new_keys_as_mmengine_does_and_name_them_in_a_warning():
    cfg = Config.fromfile(DEMO_CONFIG)
    options = {'model.mask_cfg.p': 0.2, 'custom_hooks.0.start': 0.05,
               'model.mask_cfg.pp': 0.3, 'brand.new.dict': 2}
    with pytest.warns(UserWarning) as caught:
        merge_cfg_options(cfg, options)
    message = str(caught[0].message)
    assert "model.mask_cfg has no key 'pp' (did you mean 'model.mask_cfg.p'?)" in message
    assert 'Its keys are: mode, num, p.' in message
    assert "the config has no key 'brand'" in message
    assert 'custom_hooks.0.start' not in message and "'model.mask_cfg.p=" not in message
    assert (cfg.model.mask_cfg.p, cfg.model.mask_cfg.pp) == (0.2, 0.3)
    assert cfg.custom_hooks[0].start == 0.05 and cfg.brand.new.dict == 2
    assert check_cfg_options(cfg, {'model.mask_cfg.p': 0.1}) == []   # nothing added: silent
    with pytest.raises(ConfigOptionError, match=r'custom_hooks is a list of \d items'):
        check_cfg_options(cfg, {'custom_hooks.9.start': 0.05})
    with pytest.raises(ConfigOptionError, match=r'model.mask_cfg.p is 0.2 \(float\), not a dict'):
        check_cfg_options(cfg, {'model.mask_cfg.p.x': 1})


# --- 7. a moved or copied work dir ---------------------------------------------------------

def test_the_pointer_is_relative_and_a_copied_work_dir_resumes_from_its_own_file(
        trained_run, data_root, tmp_path):
    assert (trained_run / 'last_checkpoint').read_text() == 'epoch_2.pth'
    original, copy = tmp_path / 'original', tmp_path / 'copy'
    shutil.copytree(trained_run, original)
    # A pointer as mmengine and earlier versions wrote it: absolute, into the original.
    (original / 'last_checkpoint').write_text(str(original / 'epoch_2.pth'))
    shutil.copytree(original, copy)
    result = run(*train_args(data_root, copy, '--resume'))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f'Load checkpoint from {copy / "epoch_2.pth"}' in output
    assert f'names {original / "epoch_2.pth"}, outside this work dir' in output


def test_a_moved_work_dir_resumes_from_its_checkpoint(trained_run, data_root, tmp_path):
    old, new = tmp_path / 'old', tmp_path / 'new'
    shutil.copytree(trained_run, old)
    (old / 'last_checkpoint').write_text(str(old / 'epoch_2.pth'))
    old.rename(new)
    result = run(*train_args(data_root, new, '--resume'))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f'Load checkpoint from {new / "epoch_2.pth"}' in output
    assert 'resumed epoch: 2' in output


def test_read_last_checkpoint_rules(tmp_path):
    work_dir, elsewhere = tmp_path / 'work', tmp_path / 'elsewhere'
    work_dir.mkdir()
    elsewhere.mkdir()
    assert read_last_checkpoint(str(work_dir)) is None
    pointer = work_dir / 'last_checkpoint'
    pointer.write_text('epoch_3.pth')
    assert read_last_checkpoint(str(work_dir)) == str(work_dir / 'epoch_3.pth')
    # Absolute into another folder: that file when the work dir has none of the name
    # (CheckpointHook's out_dir), the work dir's own file when it has one.
    (elsewhere / 'epoch_3.pth').write_bytes(b'x')
    pointer.write_text(str(elsewhere / 'epoch_3.pth'))
    assert read_last_checkpoint(str(work_dir)) == str(elsewhere / 'epoch_3.pth')
    (work_dir / 'epoch_3.pth').write_bytes(b'x')
    assert read_last_checkpoint(str(work_dir)) == str(work_dir / 'epoch_3.pth')


def test_a_resumed_best_checkpoint_outside_the_work_dir_is_left_alone(tmp_path):
    from types import SimpleNamespace

    from mmengine.logging import MessageHub

    from mst_mm.engine import SafeCheckpointHook
    hook = SafeCheckpointHook(interval=1, save_best='auto')
    hub = MessageHub.get_instance('best_ckpt_test')
    hub.update_info('best_ckpt', str(tmp_path / 'original' / 'best_acc_epoch_3.pth'))
    runner = SimpleNamespace(work_dir=str(tmp_path / 'copy'), message_hub=hub,
                             logger=SimpleNamespace(info=print), _resume=True)
    hook.before_train(runner)
    assert hook.best_ckpt_path == str(tmp_path / 'copy' / 'best_acc_epoch_3.pth')


def test_load_report_names_shape_mismatches_and_a_shifted_prefix():
    from torch import nn

    from mst_mm.engine import load_state_dict_checked, raise_if_incomplete
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    report = load_state_dict_checked(net, {
        '0.weight': torch.zeros(4, 2), '0.bias': torch.ones(3),
        'extra.1.weight': torch.zeros(3), 'extra.1.bias': torch.zeros(3)})
    assert report.num_loaded == 1 and torch.equal(net[0].bias, torch.ones(3))
    assert report.mismatched == {'0.weight': '(4, 2) in the checkpoint and (3, 2) in the model'}
    with pytest.raises(IncompleteCheckpointError) as refused:
        raise_if_incomplete(report, 'f.pth', 'the net', False, 'FIX.', 'PARTIAL.')
    assert str(refused.value) == (
        'f.pth provides 1 of the 6 weights of the net; not loaded, so left randomly '
        'initialised: 0: 1 of 2 tensors (weight); 1: 4 of 4 tensors (bias, running_mean, '
        'running_var, weight); of these, shapes differ: 0.weight is (4, 2) in the checkpoint '
        "and (3, 2) in the model. 2 of the missing weights are in the file under the prefix "
        "'extra.'. FIX. PARTIAL.")
    raise_if_incomplete(report, 'f.pth', 'the net', True, 'FIX.')  # only a warning
