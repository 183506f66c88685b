"""Bad command lines and configs: malformed ``--cfg-options``, an added key, a config that
``tools/test.py`` cannot run. Each names the input and the fix; once, in a subprocess, the
error is checked to be one line on stderr with status 2 and no traceback."""
import subprocess
import sys

import pytest
from mmengine.config import Config

from mst_mm.errors import UserInputError
from mst_mm.utils import check_cfg_options, merge_cfg_options
from mst_mm.utils.cli import check_test_config
from tests.helpers import DEMO_CONFIG, REPO, load_tool

KNN_CONFIG = str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py')


@pytest.mark.slow
def test_test_py_on_a_pretraining_config_says_what_to_run_instead(tmp_path):
    checkpoint = tmp_path / 'epoch_10.pth'   # never opened: the config is refused first
    cmd = [sys.executable, str(REPO / 'tools' / 'test.py'), DEMO_CONFIG, str(checkpoint)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f'test.py: error: {DEMO_CONFIG} is a pretraining config (model type MST)'
            in result.stderr), result.stderr[-3000:]
    # The k-NN config of the same (demo) backbone, with the checkpoint filled in; the DeiT-S
    # benchmarks do not fit the demo's tiny ViT and are not offered.
    assert ('python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_vit-tiny_demo.py '
            f'{checkpoint}') in result.stderr
    assert 'deit-s' not in result.stderr
    assert f'--resume {checkpoint}' in result.stderr
    assert '_test_loop' not in result.stderr and 'Traceback' not in result.stderr


def test_check_test_config_offers_the_benchmarks_of_the_same_backbone():
    cfg = Config(dict(model=dict(type='MST')))
    with pytest.raises(UserInputError) as error:
        check_test_config(cfg, 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 'C.pth')
    message = str(error.value)
    for expected in (
            'knn_eval.py configs/benchmarks/knn/knn_deit-s_in1k.py C.pth',
            'tools/train.py configs/benchmarks/classification/'
            'linear_deit-s_cls-last_8xb128-100e_in1k.py --cfg-options '
            'model.backbone.init_cfg.checkpoint=C.pth',
            'mst2downstream.py C.pth pretrain/mst_deit-s_mmseg.pth --target mmseg, then '
            'python tools/train.py configs/benchmarks/mmsegmentation/'):
        assert expected in message, message
    assert 'swin' not in message and 'vit-tiny' not in message
    # A config with a test split passes; one without and no MST says what it lacks.
    check_test_config(Config(dict(test_dataloader=dict(), test_evaluator=dict())), 'x.py', 'c')
    with pytest.raises(UserInputError, match='x.py has no test_evaluator'):
        check_test_config(Config(dict(model=dict(type='ImageClassifier'),
                                      test_dataloader=dict())), 'x.py', 'c')


def test_tools_test_py_sends_a_knn_config_to_the_knn_tool(tmp_path):
    with pytest.raises(UserInputError) as refused:
        load_tool('tools/test.py').main([KNN_CONFIG, str(tmp_path / 'c.pth'), '--work-dir',
                                         str(tmp_path / 'work')])
    assert 'is a k-NN config: run it with the k-NN tool' in str(refused.value)
    assert f'tools/analysis/knn_eval.py {KNN_CONFIG} {tmp_path / "c.pth"}' in str(refused.value)
    assert not (tmp_path / 'work').exists()


@pytest.mark.parametrize('option, fragments', [
    ('model.mask_cfg.p', ['no "=" in \'model.mask_cfg.p\'', 'KEY=VALUE']),
    ('model.mask_cfg.p=[0.1',
     ["unbalanced brackets in the value of model.mask_cfg.p: '[0.1'", 'KEY=[a,b]']),
    ('model.mask_cfg.p=[(0.1])', ['unbalanced brackets']),
    ('model.mask_cfg.p="0.1', ['unmatched " in the value of model.mask_cfg.p']),
])
def test_bad_cfg_options_name_the_option_and_the_expected_form(option, fragments, tmp_path,
                                                                capsys):
    with pytest.raises(SystemExit) as exit_status:
        load_tool('tools/train.py').main([DEMO_CONFIG, '--work-dir', str(tmp_path / 'work'),
                                          '--cfg-options', 'train_cfg.max_epochs=1', option])
    assert exit_status.value.code == 2
    stderr = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in stderr, stderr
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
    with pytest.raises(UserInputError, match=r'custom_hooks is a list of \d items'):
        check_cfg_options(cfg, {'custom_hooks.9.start': 0.05})
    with pytest.raises(UserInputError, match=r'model.mask_cfg.p is 0.2 \(float\), not a dict'):
        check_cfg_options(cfg, {'model.mask_cfg.p.x': 1})


def _suggested(config: str, checkpoint: str) -> str:
    with pytest.raises(UserInputError) as refused:
        check_test_config(Config.fromfile(str(REPO / config)), config, checkpoint)
    return str(refused.value)


def _width(backbone) -> int:
    from mmpretrain.registry import MODELS
    arch = backbone.arch
    return arch.embed_dims if isinstance(arch, dict) else \
        MODELS.get(backbone.type).arch_zoo[arch]['embed_dims']


def test_the_demo_and_the_evidence_vit_each_get_the_knn_config_of_their_width():
    """The 96-wide demo ViT and the 48-wide evidence ViT share the name vit-tiny."""
    evidence = _suggested('configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py', 'C.pth')
    assert 'knn/knn_vit-tiny-48_animals.py C.pth' in evidence
    assert 'knn_vit-tiny_demo.py' not in evidence
    demo = _suggested('configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py', 'C.pth')
    assert 'knn/knn_vit-tiny_demo.py C.pth' in demo and '-48_' not in demo


@pytest.mark.slow
def test_every_suggested_knn_config_is_as_wide_as_the_pretraining_backbone():
    """Every config under configs/mst/ is offered only k-NN configs that fit its backbone."""
    import re
    checked = 0
    for path in sorted((REPO / 'configs' / 'mst').rglob('*.py')):
        config = str(path.relative_to(REPO))
        cfg = Config.fromfile(str(path))
        for knn in re.findall(r'knn_eval\.py (\S+) C\.pth', _suggested(config, 'C.pth')):
            assert _width(Config.fromfile(str(REPO / knn)).model.backbone) == _width(
                cfg.model.backbone), (config, knn)
            checked += 1
    assert checked >= 10


def test_the_suggested_knn_config_loads_the_evidence_checkpoint_and_the_width_is_read_from_it(
        tmp_path):
    import torch
    from mmpretrain.registry import MODELS
    evidence = 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py'
    torch.manual_seed(0)
    mst = MODELS.build(Config.fromfile(str(REPO / evidence)).model)
    checkpoint = tmp_path / 'epoch_6.pth'
    torch.save({'state_dict': mst.state_dict()}, checkpoint)
    message = _suggested(evidence, str(checkpoint))
    knn = 'configs/benchmarks/knn/knn_vit-tiny-48_animals.py'
    assert f'knn_eval.py {knn} {checkpoint}' in message
    assert message.count('knn_eval.py') == 1
    knn_cfg = Config.fromfile(str(REPO / knn))
    assert knn_cfg.test_dataloader.dataset.data_root == 'data/animal_shapes/objects/test'
    embedder = MODELS.build(knn_cfg.model)
    embedder.load_state_dict(mst.state_dict(), strict=True)   # every key, every shape
    for name, value in embedder.backbone.state_dict().items():
        torch.testing.assert_close(value, mst.teacher.module[0].state_dict()[name])
    # A 96-wide (demo) checkpoint given with the 48-wide config: its own width decides.
    demo = MODELS.build(Config.fromfile(DEMO_CONFIG).model)
    torch.save({'state_dict': demo.state_dict()}, tmp_path / 'demo.pth')
    message = _suggested(evidence, str(tmp_path / 'demo.pth'))
    assert 'knn/knn_vit-tiny_demo.py' in message and '-48_' not in message


def test_an_installed_wheel_suggests_the_configs_it_carries_for_mim(tmp_path, monkeypatch):
    """Installed from a wheel, mst_mm has no repository around it: the suggestions come from
    mst_mm/.mim/configs (setup.py's add_mim_extension), named by their full path."""
    from mst_mm.utils import cli
    package = tmp_path / 'site-packages' / 'mst_mm'
    (package / '.mim').mkdir(parents=True)
    (package / '.mim' / 'configs').symlink_to(REPO / 'configs')
    assert cli.config_root() == (str(REPO), True)
    monkeypatch.setattr(cli, '_PACKAGE', str(package))
    assert cli.config_root() == (str(package / '.mim'), False)
    demo = _suggested('configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py', 'C.pth')
    knn = package / '.mim' / 'configs' / 'benchmarks' / 'knn' / 'knn_vit-tiny_demo.py'
    assert f'knn_eval.py {knn} C.pth' in demo


def test_a_width_that_no_benchmark_config_has_is_said(tmp_path):
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.model.backbone.arch.embed_dims = 40
    with pytest.raises(UserInputError) as refused:
        check_test_config(cfg, 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py', 'C.pth')
    assert ('none of the benchmark configs of this backbone is 40 wide; copy one and set its '
            'embed_dims to 40') in str(refused.value)
    assert 'knn_eval.py' not in str(refused.value)
