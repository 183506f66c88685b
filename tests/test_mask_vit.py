"""MaskViT: [MASK] after patch embedding (Eq. 7), CLS attention of the last layer (Eq. 5)."""
import pytest
import torch
import torch.nn.functional as F

from mst_mm.models import MaskViT

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
