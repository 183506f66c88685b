"""tools/model_converters/dino2mst.py: DINO's checkpoints as the start of an MST run.

The DINO-format files are built here with DINO's key layout (facebookresearch/dino's
``VisionTransformer`` = timm's names, ``MultiCropWrapper``'s ``backbone.`` / ``head.``,
DDP's ``module.``, the old ``nn.utils.weight_norm``'s ``weight_g`` / ``weight_v``,
``dino_loss.center``, ``args``), without the project's converter, and DINO's head is computed
independently of DINONeck.
"""
import argparse
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config

import mst_mm  # noqa: F401
from mst_mm.converters.dino import convert_dino_checkpoint, fresh_model, read_dino_checkpoint
from mst_mm.converters.names import neck_to_dino_head, timm_to_vit, vit_to_timm
from mst_mm.engine import build_runner, load_checked, read_checkpoint, state_dict_of
from mst_mm.errors import CheckpointError, UserInputError
from tests.helpers import REPO, load_tool, make_image_folder, tiny_runner_cfg

timm = pytest.importorskip('timm')
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

TOOL = 'tools/model_converters/dino2mst.py'
DEIT_S = REPO / 'configs' / 'mst' / 'mst_deit-s-p16_8xb128-coslr-300e_in1k.py'
DINO_HEAD = REPO / 'configs' / 'mst' / 'mst-dino-head_deit-s-p16_8xb128-coslr-100e_in1k.py'
# The demo's ViT (32 px, 4-px patches, 96 wide, 4 blocks) and head sizes, with DINO's head
# layout (no BN): the layout of the DINO-head config at a size that trains on a CPU.
TINY_VIT = dict(img_size=32, patch_size=4, embed_dim=96, depth=4, num_heads=4)
TINY_HEAD = dict(in_dim=96, hidden_dim=512, bottleneck_dim=64, out_dim=1024)


class ReferenceDINOHead(nn.Module):
    """DINO's head as DINO writes it: Linear-GELU MLP, L2 normalisation, a last layer
    weight-normalised with the old API (``weight_g``, ``weight_v``)."""

    def __init__(self, in_dim, out_dim, hidden_dim, bottleneck_dim, nlayers=3):
        super().__init__()
        layers = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
        for _ in range(nlayers - 2):
            layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
        layers.append(nn.Linear(hidden_dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        with warnings.catch_warnings():  # the old API is deprecated, and what DINO used
            warnings.simplefilter('ignore')
            self.last_layer = nn.utils.weight_norm(nn.Linear(bottleneck_dim, out_dim,
                                                             bias=False))

    def forward(self, x):  # not used by the checks: they compute the head by hand
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


def reference_head_output(state: dict, x: torch.Tensor) -> torch.Tensor:
    """DINO's head from its state dict alone: mlp, F.normalize, g * v / ||v|| (per row)."""
    linears = sorted({int(k.split('.')[1]) for k in state if k.startswith('mlp.')})
    for i, index in enumerate(linears):
        x = F.linear(x, state[f'mlp.{index}.weight'], state[f'mlp.{index}.bias'])
        if i < len(linears) - 1:
            x = F.gelu(x)
    x = F.normalize(x, dim=-1, p=2)
    v, g = state['last_layer.weight_v'], state['last_layer.weight_g']
    return F.linear(x, g * v / v.norm(dim=1, keepdim=True))


def perturbed(module: nn.Module, seed: int, scale: float = 0.05) -> nn.Module:
    """Every tensor moved off its initial value, so that no swap of names goes unnoticed
    (fresh LayerNorms are all ones and zeros)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return module.eval()


def tiny_timm_vit(seed: int, **overrides) -> nn.Module:
    torch.manual_seed(seed)
    return perturbed(VisionTransformer(**{**TINY_VIT, **overrides}, num_classes=0), seed)


def dino_wrapper_state(vit: nn.Module, head: nn.Module, prefix: str) -> dict:
    """A MultiCropWrapper's state dict, as main_dino.py saves it (DDP adds `module.`)."""
    return {**{f'{prefix}backbone.{k}': v for k, v in vit.state_dict().items()},
            **{f'{prefix}head.{k}': v for k, v in head.state_dict().items()}}


def write_full_checkpoint(path, student_prefix='module.', teacher_prefix='module.'):
    """A DINO full checkpoint of the tiny size: student and teacher that differ, heads with
    trained magnitudes (norm_last_layer false), a centre, and DINO's other entries."""
    nets = {}
    for role, seed in (('student', 1), ('teacher', 2)):
        vit = tiny_timm_vit(seed)
        torch.manual_seed(seed + 10)
        head = perturbed(ReferenceDINOHead(**TINY_HEAD), seed + 20)
        with torch.no_grad():   # magnitudes other than DINO's initial 1
            head.last_layer.weight_g.uniform_(0.5, 1.5)
        nets[role] = (vit, head)
    center = torch.randn(1, TINY_HEAD['out_dim'], generator=torch.Generator().manual_seed(3))
    optimizer = torch.optim.AdamW(nets['student'][0].parameters())
    args = argparse.Namespace(arch='vit_tiny', patch_size=4, out_dim=TINY_HEAD['out_dim'],
                              norm_last_layer=False, use_bn_in_head=False, lr=5e-4,
                              global_crops_scale=(0.4, 1.0), data_path='/data/train')
    torch.save(dict(student=dino_wrapper_state(*nets['student'], student_prefix),
                    teacher=dino_wrapper_state(*nets['teacher'], teacher_prefix),
                    optimizer=optimizer.state_dict(), epoch=100, args=args,
                    dino_loss=dict(center=center)), path)
    return nets, center


def tiny_dino_head_cfg(tmp_path, max_epochs=1):
    """The demo-size runner config with DINO's head layout (no BN), written to a file."""
    data = make_image_folder(tmp_path / 'images', classes=2, per_class=4)
    cfg = tiny_runner_cfg(data, tmp_path / 'work', max_epochs=max_epochs)
    cfg.model.neck.with_bn = False
    path = tmp_path / 'tiny_dino_head.py'
    cfg.dump(str(path))
    return cfg, str(path)


def run_tool(*args):
    return subprocess.run([sys.executable, str(REPO / TOOL), *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def teacher_cls(model, images):
    with torch.no_grad():
        return model.teacher.module[0].forward_mst(images, with_patches=False).global_feat


def test_full_checkpoint_starts_the_run_with_both_networks_the_head_and_the_centre(tmp_path):
    nets, center = write_full_checkpoint(tmp_path / 'dino_full.pth')
    cfg, cfg_path = tiny_dino_head_cfg(tmp_path)
    out = tmp_path / 'mst_start.pth'
    messages = []
    convert_dino_checkpoint(str(tmp_path / 'dino_full.pth'), str(out), cfg_path,
                            log=messages.append)
    fresh = [m for m in messages if m.startswith('Initialised as in a fresh run')]
    assert len(fresh) == 1 and '[MASK] token' in fresh[0] and 'image decoder' in fresh[0]
    assert 'neck' not in fresh[0] and 'centre' not in fresh[0]

    # load_from's own path: the project's runner, which refuses a load that leaves weights out
    cfg.load_from = str(out)
    runner = build_runner(cfg)
    runner.load_or_resume()
    model = runner.model.eval()

    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    (s_vit, s_head), (t_vit, t_head) = nets['student'], nets['teacher']
    with torch.no_grad():
        ours = teacher_cls(model, images)
        theirs = t_vit.forward_features(images)[:, 0]   # final norm, then the CLS token
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        assert ours.std() > 0.1
        student = model.backbone.forward_mst(images, with_patches=False).global_feat
        torch.testing.assert_close(student, s_vit(images), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(student, ours, atol=1e-3)   # each from its own network
        for neck, head in ((model.teacher.module[1], t_head), (model.neck, s_head)):
            expected = reference_head_output(head.state_dict(), theirs)
            torch.testing.assert_close(neck(theirs), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.head.center, center)
    # The EMA keeps the file's teacher: its first update must not copy the student over it.
    assert int(model.teacher.steps) == 1


def test_the_run_trains_from_the_converted_file(tmp_path):
    write_full_checkpoint(tmp_path / 'dino_full.pth')
    cfg, cfg_path = tiny_dino_head_cfg(tmp_path, max_epochs=2)
    out = tmp_path / 'mst_start.pth'
    result = run_tool(tmp_path / 'dino_full.pth', out, '--config', cfg_path)
    assert result.returncode == 0, result.stderr
    loaded = torch.load(out, weights_only=True)
    cfg.load_from = str(out)
    runner = build_runner(cfg)
    runner.train()    # 2 epochs of 2 iterations: the epoch, optimiser and schedules start fresh
    assert runner.iter == 4 and runner.epoch == 2
    state = runner.model.state_dict()
    # four EMA steps at DINO's momentum: the teacher moved only slightly from the file's
    moved = (state['teacher.module.0.layers.0.attn.qkv.weight']
             - loaded['state_dict']['teacher.module.0.layers.0.attn.qkv.weight']).abs().max()
    assert 0 < moved < 0.05


@pytest.mark.slow
def test_dino_vit_small_backbone_file_starts_the_deit_s_recipe(tmp_path):
    """DINO's released ViT-S/16 layout (timm's vit_small_patch16_224 names) into the default
    config, the 300-epoch DeiT-S recipe: 197 position tokens, qkv bias, LayerNorm eps 1e-6."""
    vit = perturbed(timm.create_model('vit_small_patch16_224', pretrained=False,
                                      num_classes=0), seed=5, scale=0.02)
    torch.save(vit.state_dict(), tmp_path / 'dino_deitsmall16_pretrain.pth')
    out = tmp_path / 'mst_deit-s_start.pth'
    lines = []
    convert_dino_checkpoint(str(tmp_path / 'dino_deitsmall16_pretrain.pth'),
                            str(out), str(DEIT_S), log=lines.append)
    fresh, = [m for m in lines if m.startswith('Initialised as in a fresh run')]
    # the recipe's neck has BN: DINO's file has no head anyway, so the neck is fresh
    assert 'projection neck' in fresh and '[MASK] token' in fresh
    model = fresh_model(Config.fromfile(str(DEIT_S)))
    load_checked(model, state_dict_of(read_checkpoint(str(out)), str(out)), str(out),
                 'the model', '')   # CheckedRunner.load_checkpoint's call: every weight
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(teacher_cls(model, image), vit(image), rtol=1e-4,
                                   atol=1e-4)
    # the teacher's neck is the student's (as a fresh run's first EMA step would make it)
    state = model.state_dict()
    assert torch.equal(state['teacher.module.1.mlp.0.weight'], state['neck.mlp.0.weight'])
    assert int(model.teacher.steps) == 0


def test_a_timm_state_dict_loses_its_classifier_and_says_so(tmp_path):
    vit = VisionTransformer(**TINY_VIT, num_classes=10)
    torch.save(vit.state_dict(), tmp_path / 'timm.pth')
    weights = read_dino_checkpoint(str(tmp_path / 'timm.pth'))
    assert 'head.weight' not in weights.student_backbone
    assert weights.student_backbone is weights.teacher_backbone
    assert any('head.weight, head.bias' in note for note in weights.notes)
    assert weights.student_head is None and weights.center is None


@pytest.mark.parametrize('student_prefix, teacher_prefix', [('module.', ''), ('', '')])
def test_prefixes_and_a_single_network(tmp_path, student_prefix, teacher_prefix):
    nets, center = write_full_checkpoint(tmp_path / 'full.pth', student_prefix, teacher_prefix)
    weights = read_dino_checkpoint(str(tmp_path / 'full.pth'))
    assert torch.equal(weights.teacher_backbone['norm.weight'],
                       nets['teacher'][0].state_dict()['norm.weight'])
    assert set(weights.teacher_head) == set(nets['teacher'][1].state_dict())
    assert torch.equal(weights.center, center)
    # the teacher alone (what one would keep for evaluation): both networks start from it
    full = torch.load(tmp_path / 'full.pth', weights_only=False)
    torch.save(dict(teacher=full['teacher']), tmp_path / 'teacher_only.pth')
    weights = read_dino_checkpoint(str(tmp_path / 'teacher_only.pth'))
    assert weights.student_backbone is weights.teacher_backbone
    assert any('only the teacher' in note for note in weights.notes)


def test_a_backbone_that_does_not_fit_is_refused_by_key_and_shape(tmp_path):
    _, cfg_path = tiny_dino_head_cfg(tmp_path)
    wider = VisionTransformer(**{**TINY_VIT, 'embed_dim': 128}, num_classes=0)
    torch.save(wider.state_dict(), tmp_path / 'wider.pth')
    result = run_tool(tmp_path / 'wider.pth', tmp_path / 'out.pth', '--config', cfg_path)
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith('dino2mst.py: error:')
    assert 'cls_token (1, 1, 128) in the file, (1, 1, 96) in the config' in error[0]
    assert not (tmp_path / 'out.pth').exists()
    # a DINOv2-style ViT (layer scale) names the tensors MST's ViT has no place for
    with pytest.raises(CheckpointError, match=r'blocks\.0\.ls1\.gamma'):
        timm_to_vit({**wider.state_dict(), 'blocks.0.ls1.gamma': torch.ones(128)})


class _RunsCode:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('ran')", ))


def test_a_code_running_pickle_and_a_truncated_file_end_with_one_message(tmp_path):
    torch.save({'cls_token': torch.zeros(1, 1, 96), 'payload': _RunsCode()},
               tmp_path / 'evil.pth')
    result = run_tool(tmp_path / 'evil.pth', tmp_path / 'out.pth')
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and 'Refusing to load' in error[0] and 'run code' in error[0]
    assert not (REPO / 'PWNED').exists() and not (tmp_path / 'out.pth').exists()

    write_full_checkpoint(tmp_path / 'full.pth')
    data = (tmp_path / 'full.pth').read_bytes()
    (tmp_path / 'cut.pth').write_bytes(data[:len(data) // 2])
    result = run_tool(tmp_path / 'cut.pth', tmp_path / 'out.pth')
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and 'truncated' in error[0], result.stderr


def test_timm_names_round_trip():
    vit = VisionTransformer(**TINY_VIT, num_classes=0)
    state = vit.state_dict()
    ours = timm_to_vit(state)
    assert 'layers.3.ffn.layers.0.0.weight' in ours and 'ln1.bias' in ours
    assert vit_to_timm(ours).keys() == state.keys()


def _mst_training_checkpoint(path, cfg):
    """An MST training checkpoint of `cfg`'s model whose teacher differs from its student."""
    state = fresh_model(cfg).state_dict()
    generator = torch.Generator().manual_seed(7)
    state = {k: v + 0.01 * torch.randn(v.shape, generator=generator)
             if v.is_floating_point() and k.startswith('teacher.module.') else v
             for k, v in state.items()}
    state['head.center'] = torch.randn(state['head.center'].shape, generator=generator)
    torch.save(dict(state_dict=state, meta=dict(epoch=6, iter=750)), path)
    return state


def test_mst_to_timm_then_dino2mst_gives_back_the_backbone(tmp_path):
    cfg, cfg_path = tiny_dino_head_cfg(tmp_path)
    original = _mst_training_checkpoint(tmp_path / 'epoch_6.pth', cfg)
    with pytest.raises(UserInputError, match='already an MST checkpoint.*load_from'):
        read_dino_checkpoint(str(tmp_path / 'epoch_6.pth'))
    export = load_tool('tools/model_converters/mst2downstream.py')
    export.main([str(tmp_path / 'epoch_6.pth'), str(tmp_path / 'timm.pth'), '--target', 'timm'])
    load_tool(TOOL).main([str(tmp_path / 'timm.pth'), str(tmp_path / 'back.pth'),
                          '--config', cfg_path])
    back = torch.load(tmp_path / 'back.pth', weights_only=True)['state_dict']
    teacher = [k for k in original if k.startswith('teacher.module.0.')]
    assert len(teacher) == 4 * 12 + 6
    for key in teacher:   # the exported teacher backbone comes back, in both networks
        assert torch.equal(back[key], original[key]), key
        student_key = key.replace('teacher.module.0.', 'backbone.')
        assert torch.equal(back[student_key], original[key]), student_key


def test_mst_to_dino_then_dino2mst_gives_back_both_networks_and_the_centre(tmp_path):
    cfg, cfg_path = tiny_dino_head_cfg(tmp_path)
    original = _mst_training_checkpoint(tmp_path / 'epoch_6.pth', cfg)
    export = load_tool('tools/model_converters/mst2downstream.py')
    export.main([str(tmp_path / 'epoch_6.pth'), str(tmp_path / 'dino.pth'), '--target', 'dino'])
    dino = torch.load(tmp_path / 'dino.pth', weights_only=True)
    # DINO's layout: what eval_knn.py reads with --checkpoint_key teacher, after taking off
    # `module.` and `backbone.`, loads strictly into DINO's (timm's) ViT, the head aside
    teacher = {k.replace('backbone.', ''): v for k, v in dino['teacher'].items()
               if not k.startswith('head.')}
    VisionTransformer(**TINY_VIT, num_classes=0).load_state_dict(teacher, strict=True)
    assert all(k.startswith('module.') for k in dino['student'])   # DDP, as main_dino saves
    assert 'head.last_layer.weight_g' in dino['teacher']          # no BN: teacher not DDP
    assert set(dino['dino_loss']) == {'center'}

    load_tool(TOOL).main([str(tmp_path / 'dino.pth'), str(tmp_path / 'back.pth'),
                          '--config', cfg_path])
    back = torch.load(tmp_path / 'back.pth', weights_only=True)['state_dict']
    kept = [k for k in original if k.startswith(('backbone.', 'neck.', 'teacher.module.'))
            and k != 'backbone.mask_token']
    for key in kept + ['head.center']:
        assert torch.equal(back[key], original[key]), key
    assert int(back['teacher.steps']) == 1


@pytest.mark.parametrize('config, timm_name', [
    ('mst-dino-head_deit-s-p16_8xb128-coslr-100e_in1k.py', 'vit_small_patch16_224'),
    ('mst_vit-base-p16_8xb128-coslr-100e_in1k.py', 'vit_base_patch16_224')])
def test_the_configs_take_dinos_released_architectures(config, timm_name):
    """Every backbone tensor of DINO's ViT-S/16 and ViT-B/16 (timm's names and shapes) has
    its place in the config's ViT, and the DINO-head config's neck has DINO's head layout."""
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(str(REPO / 'configs' / 'mst' / config))
    backbone = MODELS.build({**cfg.model.backbone, 'use_mask_token': False})
    ours = {k: v.shape for k, v in vit_to_timm(backbone.state_dict()).items()}
    theirs = {k: v.shape for k, v in timm.create_model(
        timm_name, pretrained=False, num_classes=0).state_dict().items()}
    assert ours == theirs
    assert backbone.layers[0].ln1.eps == 1e-6 and backbone.layers[0].attn.qkv.bias is not None
    if 'dino-head' in config:
        neck = MODELS.build(cfg.model.neck)
        dino = ReferenceDINOHead(384, 65536, 2048, 256)
        expected = {k: v.shape for k, v in dino.state_dict().items()}
        assert {k: v.shape for k, v in neck_to_dino_head(neck.state_dict()).items()} == expected


def test_a_neck_of_another_layout_starts_fresh_unless_the_options_match(tmp_path, capsys):
    """The recipe's neck has BN, DINO's released heads do not: the neck and the centre start
    fresh and the one log line says why; the run's --cfg-options, given to the converter too,
    make the layouts agree."""
    write_full_checkpoint(tmp_path / 'full.pth')
    data = make_image_folder(tmp_path / 'images', classes=2, per_class=2)
    cfg = tiny_runner_cfg(data, tmp_path / 'work')   # the demo's neck: with BN
    cfg.dump(str(tmp_path / 'bn.py'))
    tool = load_tool(TOOL)
    state = tool.main([str(tmp_path / 'full.pth'), str(tmp_path / 'a.pth'),
                       '--config', str(tmp_path / 'bn.py')])
    fresh, = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith('Initialised as in a fresh run')]
    assert 'projection neck' in fresh and 'another layout' in fresh and 'mlp.1.' in fresh
    assert not state['head.center'].any()   # a fresh centre is zero
    assert torch.equal(state['teacher.module.1.mlp.0.weight'], state['neck.mlp.0.weight'])
    state = tool.main([str(tmp_path / 'full.pth'), str(tmp_path / 'b.pth'), '--config',
                       str(tmp_path / 'bn.py'), '--cfg-options', 'model.neck.with_bn=False'])
    fresh, = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith('Initialised as in a fresh run')]
    assert 'neck' not in fresh and state['head.center'].any()
