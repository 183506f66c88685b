"""MaskViT: [MASK] after patch embedding (Eq. 7), CLS attention of the last layer (Eq. 5)."""
import math

import pytest
import torch
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_

from mst_mm.models import MaskViT
from mst_mm.models.backbones.mask_vit import dino_resize_pos_embed

TINY = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)


def tiny_vit(**kwargs):
    torch.manual_seed(0)
    vit = MaskViT(arch=TINY, img_size=32, patch_size=8, **kwargs)
    vit.init_weights()
    vit.eval()  # mmpretrain's BaseBackbone.train() returns None, so no chaining
    return vit


def test_fused_path_attention_equals_hand_computation_from_q_and_k():
    vit = tiny_vit()
    captured = {}
    last = vit.layers[-1]
    handle = last.attn.qkv.register_forward_hook(lambda m, i, o: captured.setdefault('qkv', o))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        feats = vit.forward_mst(x, with_attn=True)
    handle.remove()

    batch, tokens, _ = captured['qkv'].shape
    qkv = captured['qkv'].reshape(batch, tokens, 3, 4, 8).permute(2, 0, 3, 1, 4)
    q, k = qkv[0], qkv[1]
    full = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)  # (B, H, T, T)
    expected = full.mean(dim=1)[:, 0, 1:]
    assert feats.attn.shape == (3, 16)
    torch.testing.assert_close(feats.attn, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(feats.attn_heads, full[:, :, 0, 1:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(feats.attn.sum(dim=1) + full.mean(1)[:, 0, 0], torch.ones(3))


def test_attention_pass_changes_nothing_else():
    vit = tiny_vit()
    # Every block, the last included, runs the fused kernel for its output.
    assert all(layer.attn.scaled_dot_product_attention is F.scaled_dot_product_attention
               for layer in vit.layers)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plain = vit.forward_mst(x)
        with_attn = vit.forward_mst(x, with_attn=True)
        stock = vit(x)[-1]  # mmpretrain's forward, out_type='cls_token'
    assert plain.attn is None
    torch.testing.assert_close(plain.global_feat, with_attn.global_feat)
    torch.testing.assert_close(plain.feat_map, with_attn.feat_map)
    torch.testing.assert_close(plain.global_feat, stock)
    assert plain.feat_map.shape == (2, 32, 4, 4)


def test_without_patches_the_last_layer_runs_for_the_cls_token_only():
    # Float64 and training mode with stochastic depth: the CLS output, the attention and
    # every gradient equal the full layer's, and the drop-path draws are the same.
    vit = tiny_vit(drop_path_rate=0.5).double()
    vit.train()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    mask = torch.zeros(3, 16, dtype=torch.bool)
    mask[:, 5] = True
    weights = torch.randn(3, 32, dtype=torch.float64)
    rows = []
    handle = vit.layers[-1].ffn.register_forward_hook(lambda m, i, o: rows.append(i[0].shape))

    def run(**kwargs):
        vit.zero_grad()
        torch.manual_seed(1)
        feats = vit.forward_mst(x, mask=mask, with_attn=True, **kwargs)
        (feats.global_feat * weights).sum().backward()
        return feats, {n: p.grad.clone() for n, p in vit.named_parameters() if p.grad is not None}

    full, full_grads = run()
    cls_only, cls_grads = run(with_patches=False)
    handle.remove()
    assert rows == [(3, 17, 32), (3, 1, 32)]  # the MLP saw 17 tokens, then only the CLS
    assert cls_only.feat_map is None and full.feat_map.shape == (3, 32, 4, 4)
    assert cls_only.grid == full.grid == (4, 4)
    torch.testing.assert_close(cls_only.global_feat, full.global_feat, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cls_only.attn_heads, full.attn_heads, rtol=1e-12, atol=1e-12)
    assert cls_grads.keys() == full_grads.keys()
    assert 'mask_token' in cls_grads and 'layers.1.attn.qkv.weight' in cls_grads
    for name, grad in full_grads.items():
        torch.testing.assert_close(cls_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)
    # Without the attention as well, the output is the same.
    with torch.no_grad():
        torch.manual_seed(1)
        plain = vit.forward_mst(x, mask=mask, with_patches=False)
    assert plain.attn is None
    torch.testing.assert_close(plain.global_feat, full.global_feat, rtol=1e-12, atol=1e-12)


def test_mask_token_replaces_patch_embedding_before_position_embedding():
    vit = tiny_vit()
    everything = torch.ones(2, 16, dtype=torch.bool)
    with torch.no_grad():
        a = vit.forward_mst(torch.randn(2, 3, 32, 32), mask=everything)
        b = vit.forward_mst(torch.randn(2, 3, 32, 32), mask=everything)
    # Fully masked: the image no longer matters ...
    torch.testing.assert_close(a.global_feat, b.global_feat)
    # ... but positions still do, so the [MASK] token went in before the position embedding.
    tokens = a.feat_map.flatten(2).transpose(1, 2)[0]
    assert (tokens[0] - tokens[5]).abs().max() > 1e-3


def test_masking_one_patch_changes_the_output_and_gradients_reach_the_mask_token():
    vit = tiny_vit()
    vit.train()
    x = torch.randn(2, 3, 32, 32)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[:, 5] = True
    masked = vit.forward_mst(x, mask=mask).global_feat
    with torch.no_grad():
        clean = vit.forward_mst(x).global_feat
    assert (masked - clean).abs().max() > 1e-4
    masked.sum().backward()
    assert vit.mask_token.grad is not None and vit.mask_token.grad.abs().sum() > 0


def test_bad_masks_are_refused():
    vit = tiny_vit()
    with pytest.raises(ValueError, match='patch grid'):
        vit.forward_mst(torch.randn(2, 3, 32, 32), mask=torch.zeros(2, 15, dtype=torch.bool))
    teacher = tiny_vit(use_mask_token=False)
    assert not any('mask_token' in n for n, _ in teacher.named_parameters())
    with pytest.raises(ValueError, match='use_mask_token=False'):
        teacher.forward_mst(torch.randn(2, 3, 32, 32), mask=torch.zeros(2, 16, dtype=torch.bool))


def test_norm_intermediate_and_multi_block_neck_follow_dino_probe():
    from mst_mm.models import MultiBlockCLSNeck

    torch.manual_seed(0)
    vit = MaskViT(arch=TINY, img_size=32, patch_size=8, out_type='raw', out_indices=[0, 1],
                  norm_intermediate=True, use_mask_token=False)
    vit.init_weights()
    vit.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        outs = vit(x)
        tokens, _ = vit._embed(x)
        first = vit.layers[0](tokens)
        second = vit.layers[1](first)
        probe_input = MultiBlockCLSNeck()(outs)[0]
        with_patches = MultiBlockCLSNeck(avgpool_patch_tokens=True)(outs)[0]
    torch.testing.assert_close(outs[0], vit.ln1(first))
    torch.testing.assert_close(outs[1], vit.ln1(second))
    torch.testing.assert_close(probe_input, torch.cat([vit.ln1(first)[:, 0],
                                                       vit.ln1(second)[:, 0]], dim=1))
    torch.testing.assert_close(with_patches[:, 64:], vit.ln1(second)[:, 1:].mean(1))


# --- Initialisation (DINO's, opt-in) -----------------------------------------------------

WIDE = dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=256)


def fresh(cls=MaskViT, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = cls(arch=WIDE, img_size=32, patch_size=8, **kwargs)
    model.init_weights()
    model.eval()
    return model


def test_dino_init_statistics_of_a_fresh_model():
    vit = fresh(dino_init=True)
    linears = [m for m in vit.modules() if isinstance(m, torch.nn.Linear)]
    norms = [m for m in vit.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(linears) == 2 * 4 and len(norms) == 2 * 2 + 1  # qkv, proj, 2 FFN; ln1, ln2
    for m in linears:
        # Truncated at +-2 (absolute, as DINO's trunc_normal_): in effect an untruncated
        # normal with std 0.02, mean 0, and zero bias.
        assert m.weight.std().item() == pytest.approx(0.02, rel=0.06)
        assert m.weight.mean().abs() < 1e-3
        assert torch.count_nonzero(m.bias) == 0
    for m in norms:
        assert torch.equal(m.weight, torch.ones_like(m.weight))
        assert torch.count_nonzero(m.bias) == 0
    assert vit.pos_embed.std().item() == pytest.approx(0.02, rel=0.1)
    assert vit.cls_token.std().item() == pytest.approx(0.02, rel=0.35)  # 64 values
    assert vit.cls_token.abs().sum() > 0          # mmpretrain leaves it at zero
    # The patch embedding's convolution and the [MASK] token are drawn as without the flag.
    default = fresh()
    assert torch.equal(vit.patch_embed.projection.weight, default.patch_embed.projection.weight)
    assert torch.equal(vit.mask_token, default.mask_token)
    assert vit.mask_token.std().item() == pytest.approx(0.02, rel=0.35)


def test_default_init_is_mmpretrains_and_differs_from_dino():
    from mmpretrain.models import VisionTransformer

    vit, stock = fresh(), fresh(VisionTransformer)
    ours = {k: v for k, v in vit.state_dict().items() if k != 'mask_token'}
    assert ours.keys() == stock.state_dict().keys()
    for key, value in stock.state_dict().items():
        torch.testing.assert_close(ours[key], value, rtol=0, atol=0, msg=key)
    # What dino_init changes: PyTorch's default for qkv (uniform, std 1/sqrt(3 * 64)) with
    # non-zero biases, Xavier for the FFN, a zero CLS token.
    qkv, fc1 = vit.layers[0].attn.qkv, vit.layers[0].ffn.layers[0][0]
    assert qkv.weight.std().item() == pytest.approx((3 * 64)**-0.5, rel=0.05)
    assert qkv.bias.abs().min() > 0
    assert fc1.weight.std().item() == pytest.approx((2 / (64 + 256))**0.5, rel=0.05)
    assert torch.count_nonzero(vit.cls_token) == 0


def test_a_trunc_normal_init_cfg_alone_does_not_reach_the_ffn():
    # Why dino_init is a backbone option and not a config-level init_cfg: mmengine applies
    # the backbone's init_cfg first, then each encoder layer's init_weights re-draws its FFN
    # with Xavier (and mmpretrain its position embedding).
    vit = fresh(init_cfg=[dict(type='TruncNormal', layer='Linear', std=.02, bias=0.)])
    qkv, fc1 = vit.layers[0].attn.qkv, vit.layers[0].ffn.layers[0][0]
    assert qkv.weight.std().item() == pytest.approx(0.02, rel=0.06)
    assert fc1.weight.std().item() == pytest.approx((2 / (64 + 256))**0.5, rel=0.05)
    assert torch.count_nonzero(vit.cls_token) == 0


@pytest.mark.parametrize('init', ['Pretrained', 'CheckedPretrained'])
def test_dino_init_leaves_a_pretrained_checkpoint_alone(tmp_path, init):
    source = fresh(seed=1, use_mask_token=False)
    torch.save(source.state_dict(), tmp_path / 'vit.pth')
    # The dict form: mmpretrain's own init_weights recognises only that one (with a list it
    # re-draws pos_embed after loading, with or without dino_init).
    vit = fresh(dino_init=True, use_mask_token=False,
                init_cfg=dict(type=init, checkpoint=str(tmp_path / 'vit.pth')))
    for key, value in source.state_dict().items():
        torch.testing.assert_close(vit.state_dict()[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize('init', ['Pretrained', 'CheckedPretrained'])
def test_a_pretrained_checkpoint_keeps_its_mask_token(tmp_path, init):
    source = fresh(seed=1)
    torch.save(source.state_dict(), tmp_path / 'vit.pth')
    vit = fresh(seed=2, init_cfg=dict(type=init, checkpoint=str(tmp_path / 'vit.pth')))
    assert torch.equal(vit.mask_token, source.mask_token)
    assert not torch.equal(fresh(seed=2).mask_token, source.mask_token)


# --- Position embedding of other resolutions ----------------------------------------------

def dino_interpolate_pos_encoding(pos_embed, img_h, img_w, patch_size):
    """DINO's ``interpolate_pos_encoding``, written out from its code for a square grid."""
    n = pos_embed.shape[1] - 1
    side, dim = math.isqrt(n), pos_embed.shape[-1]
    h0, w0 = img_h // patch_size + 0.1, img_w // patch_size + 0.1
    grid = pos_embed[:, 1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, scale_factor=(h0 / side, w0 / side), mode='bicubic')
    assert grid.shape[-2:] == (int(h0), int(w0))
    return torch.cat((pos_embed[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, dim)), dim=1)


@pytest.mark.parametrize('dst', [(6, 6), (2, 2), (3, 5), (20, 20)])
def test_dino_rule_reproduces_dinos_interpolation(dst):
    from mmpretrain.models.utils import resize_pos_embed

    pos_embed = torch.randn(1, 1 + 14 * 14, 8, generator=torch.Generator().manual_seed(0))
    ours = dino_resize_pos_embed(pos_embed, (14, 14), dst)
    expected = dino_interpolate_pos_encoding(pos_embed, dst[0] * 16, dst[1] * 16, 16)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)
    assert not torch.allclose(ours, resize_pos_embed(pos_embed, (14, 14), dst), atol=1e-3)
    assert dino_resize_pos_embed(pos_embed, (14, 14), (14, 14)) is pos_embed


def test_dino_and_size_rules_at_96_px():
    """The two rules on DeiT-S's 14 x 14 embedding for a 96-px local crop (6 x 6)."""
    from mmpretrain.models.utils import build_2d_sincos_position_embedding, resize_pos_embed

    # A smooth embedding of magnitude 0.1, like a trained one, and a freshly drawn one.
    smooth = 0.1 * build_2d_sincos_position_embedding((14, 14), 384, cls_token=True)
    torch.manual_seed(0)
    drawn = trunc_normal_(torch.empty(1, 1 + 14 * 14, 384), std=.02)
    diffs = {}
    for name, pos in (('smooth', smooth), ('drawn', drawn)):
        diff = (dino_resize_pos_embed(pos, (14, 14), (6, 6))
                - resize_pos_embed(pos, (14, 14), (6, 6)))[0, 1:].abs().amax(dim=-1)
        diffs[name] = diff.reshape(6, 6)
    # DINO's rule reads the grid over 6 / 6.1 of its extent from the top-left corner, so
    # the two agree best at the top-left patch and differ most along the bottom and right.
    smooth_diff = diffs['smooth']
    assert smooth_diff.max().item() == pytest.approx(0.022, abs=0.001)
    edges = torch.cat([smooth_diff[-1], smooth_diff[:, -1]])
    torch.testing.assert_close(edges, smooth_diff.max().expand(12))
    assert smooth_diff[0, 0] < 0.1 * smooth_diff.max()
    assert diffs['drawn'].max().item() == pytest.approx(0.029, abs=0.003)


def test_pos_embed_resize_option_reaches_both_forwards():
    from mmpretrain.models import VisionTransformer

    x = torch.randn(2, 3, 16, 16)   # a 2 x 2 patch grid against the 4 x 4 of img_size
    size, dino = tiny_vit(), tiny_vit(pos_embed_resize='dino')
    torch.manual_seed(0)
    stock = VisionTransformer(arch=TINY, img_size=32, patch_size=8)
    stock.init_weights()
    stock.eval()
    with torch.no_grad():
        tokens, _ = dino._embed(x)
        patches, _ = dino.patch_embed(x)
        expected = torch.cat((dino.cls_token.expand(2, -1, -1), patches), dim=1)
        expected = expected + dino_resize_pos_embed(dino.pos_embed, (4, 4), (2, 2))
        torch.testing.assert_close(tokens, expected)
        # The option is used by mmpretrain's forward and by forward_mst alike ...
        torch.testing.assert_close(dino(x)[-1], dino.forward_mst(x).global_feat)
        # ... differs from the default only where the grid is resized ...
        assert not torch.allclose(dino(x)[-1], size(x)[-1], atol=1e-4)
        big = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(dino(big)[-1], size(big)[-1], rtol=0, atol=0)
        # ... and the default is mmpretrain's forward, resize included.
        torch.testing.assert_close(size(x)[-1], stock(x)[-1], rtol=0, atol=0)
        torch.testing.assert_close(size.forward_mst(x).global_feat, stock(x)[-1])
    with pytest.raises(ValueError, match="pos_embed_resize 'area'"):
        tiny_vit(pos_embed_resize='area')


# --- Every configuration of the parent -----------------------------------------------------

def test_without_cls_token_it_is_mmpretrains_vit_and_only_mst_is_refused():
    from mmpretrain.models import VisionTransformer

    kwargs = dict(arch=TINY, img_size=32, patch_size=8, with_cls_token=False, out_type='featmap')
    torch.manual_seed(0)
    vit = MaskViT(**kwargs)
    vit.init_weights()
    torch.manual_seed(0)
    stock = VisionTransformer(**kwargs)
    stock.init_weights()
    vit.eval()
    stock.eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(vit(x)[-1], stock(x)[-1], rtol=0, atol=0)
    with pytest.raises(ValueError, match='forward_mst needs the CLS token.*with_cls_token=True'):
        vit.forward_mst(x)


def test_mst_vit_configs_initialise_as_dino_and_resize_by_size():
    from mmengine.config import Config
    from mmpretrain.registry import MODELS

    from tests.helpers import REPO

    checked = []
    for path in sorted((REPO / 'configs').rglob('*.py')):
        if {'_base_', 'benchmarks'} & set(path.parts):
            continue
        model = Config.fromfile(str(path)).model
        if model.type == 'MST' and model.backbone.type == 'MaskViT':
            assert model.backbone.dino_init is True, path
            assert model.backbone.pos_embed_resize == 'size', path
            checked.append(path.name)
    assert {'mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 'mst_deit-s-p16_8xb128-coslr-100e_in1k.py',
            'dino_deit-s-p16_8xb128-coslr-100e_in1k.py',
            'mst_vit-tiny-p4_1xb64-coslr-10e_demo.py'} <= set(checked)
    config = REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'
    backbone = Config.fromfile(str(config)).model.backbone
    torch.manual_seed(0)
    vit = MODELS.build(backbone)
    vit.init_weights()
    qkv, fc2 = vit.layers[5].attn.qkv, vit.layers[5].ffn.layers[1]
    assert qkv.weight.std().item() == pytest.approx(0.02, rel=0.01)
    assert fc2.weight.std().item() == pytest.approx(0.02, rel=0.01)
    assert torch.count_nonzero(qkv.bias) == torch.count_nonzero(fc2.bias) == 0
    assert vit.cls_token.std().item() == pytest.approx(0.02, rel=0.2)
