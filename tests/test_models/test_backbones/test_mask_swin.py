"""MaskSwin: guidance without a CLS token, [MASK] on the last-stage grid, MST on Swin."""
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.models import MaskSwin, attention_mask, upsample_mask
from tests.conftest import crops, tiny_mst_cfg

# Two stages: 4-px patches, one merging, so the last stage has stride 8 and each of its
# cells covers 2 x 2 patches. Local 16-px crops give a 2 x 2 last stage, below the window.
TINY_SWIN = dict(type='MaskSwin', arch=dict(embed_dims=16, depths=[1, 2], num_heads=[2, 4]),
                 img_size=32, window_size=4, out_indices=(1, ), pad_small_map=True,
                 drop_path_rate=0.1)


def tiny_swin(**kwargs) -> MaskSwin:
    torch.manual_seed(0)
    swin = MODELS.build({**TINY_SWIN, **kwargs})
    swin.init_weights()
    swin.eval()
    return swin


def last_block_input(swin: MaskSwin, x: torch.Tensor, **forward_kwargs):
    captured = {}
    block = swin.stages[-1].blocks[-1]
    handle = block.register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    with torch.no_grad():
        feats = swin.forward_mst(x, **forward_kwargs)
    handle.remove()
    return feats, captured['x']


def test_forward_mst_is_mmpretrains_forward_with_average_pooling():
    swin = tiny_swin()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plain = swin.forward_mst(x)
        guided = swin.forward_mst(x, with_attn=True)
        stock = swin(x)[-1]
    assert swin.feat_stride == 8 and swin.cell_size == 2
    assert plain.attn is None and plain.feat_map.shape == (2, 32, 4, 4)
    torch.testing.assert_close(plain.feat_map, stock)
    torch.testing.assert_close(plain.global_feat, stock.mean(dim=(2, 3)))
    torch.testing.assert_close(guided.feat_map, plain.feat_map)


def test_pooled_query_attention_equals_hand_computation():
    swin = tiny_swin()
    x = torch.randn(3, 3, 32, 32)
    feats, tokens = last_block_input(swin, x, with_attn=True)
    block = swin.stages[-1].blocks[-1]
    heads, dims = 4, 32 // 4
    norm = lambda t: F.layer_norm(t, (32, ), block.norm1.weight, block.norm1.bias)  # noqa: E731
    w, b = block.attn.w_msa.qkv.weight, block.attn.w_msa.qkv.bias
    query = norm(tokens.mean(dim=1)) @ w[:32].T + b[:32]             # (B, C)
    keys = norm(tokens) @ w[32:64].T + b[32:64]                      # (B, N, C)
    query = query.reshape(3, heads, 1, dims)
    keys = keys.reshape(3, 16, heads, dims).transpose(1, 2)
    expected = torch.softmax(query @ keys.transpose(-2, -1) / dims**0.5, dim=-1)[:, :, 0]
    assert feats.attn_heads.shape == (3, heads, 16)
    torch.testing.assert_close(feats.attn_heads, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(feats.attn, expected.mean(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(feats.attn.sum(dim=1), torch.ones(3))


def test_pooled_similarity_rule_is_cosine_to_the_average_output_token():
    swin = tiny_swin(guidance='pooled_similarity')
    with torch.no_grad():
        feats = swin.forward_mst(torch.randn(2, 3, 32, 32), with_attn=True)
    tokens = feats.feat_map.flatten(2).transpose(1, 2)
    mean = tokens.mean(dim=1, keepdim=True)
    expected = (tokens * mean).sum(-1) / (tokens.norm(dim=-1) * mean.norm(dim=-1))
    assert feats.attn_heads is None
    torch.testing.assert_close(feats.attn, expected, rtol=1e-5, atol=1e-6)


def test_mask_cell_spreads_over_its_patches_and_overhang_is_cropped():
    # A 2 x 3 grid of 2 x 2 cells over a 3 x 5 patch grid (the last row and column of
    # cells overhang, as after corner padding).
    mask = torch.tensor([[False, True, False, False, False, True]])
    expected = torch.tensor([[0, 0, 1, 1, 0],
                             [0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(upsample_mask(mask, (2, 3), 2, (3, 5)), expected.reshape(1, -1))


def test_mask_token_replaces_exactly_the_patches_of_the_masked_cells():
    swin = tiny_swin()
    x = torch.randn(2, 3, 32, 32)
    seen = []  # a pre-hook's return value would replace the arguments; append returns None
    handle = swin.stages[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, 5] = True   # cell (1, 1): patches (2..3, 2..3) of the 8 x 8 grid
    with torch.no_grad():
        unmasked = swin.forward_mst(x)
        masked = swin.forward_mst(x, mask=mask)
    handle.remove()
    clean, replaced = (t.reshape(2, 8, 8, 16) for t in seen)
    patch_mask = torch.zeros(2, 8, 8, dtype=torch.bool)
    patch_mask[0, 2:4, 2:4] = True
    assert torch.equal(replaced[patch_mask], swin.mask_token.reshape(1, 16).expand(4, 16))
    assert torch.equal(replaced[~patch_mask], clean[~patch_mask])
    assert torch.equal(masked.feat_map[1], unmasked.feat_map[1])
    assert not torch.equal(masked.feat_map[0], unmasked.feat_map[0])


def test_bad_settings_and_masks_are_refused():
    with pytest.raises(ValueError, match="guidance 'cls'.*pooled_query"):
        tiny_swin(guidance='cls')
    with pytest.raises(ValueError, match='out_indices to include the last stage'):
        tiny_swin(out_indices=(0, ))
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match=r'does not match the last-stage grid \(4, 4\)'):
        tiny_swin().forward_mst(x, mask=torch.zeros(1, 64, dtype=torch.bool))
    with pytest.raises(ValueError, match='use_mask_token=False'):
        tiny_swin(use_mask_token=False).forward_mst(x, mask=torch.zeros(1, 16, dtype=torch.bool))


def swin_mst(**overrides):
    cfg = tiny_mst_cfg(**{
        'backbone': TINY_SWIN,
        'decoder_head': dict(type='ImageDecoderHead', in_channels=32, channels=(16, 8, 8)),
        **overrides})
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.train()


@pytest.mark.parametrize('guidance', ['pooled_query', 'pooled_similarity'])
def test_mst_on_swin_masks_the_lowest_guidance_cells_and_trains(guidance, message_hub):
    model = swin_mst(mask_cfg=dict(num=4, p=1.0, mode='attention'))
    model.backbone.guidance = model.teacher.module[0].guidance = guidance
    masks = []
    original = model.backbone.forward_mst

    def spy(x, mask=None, **kwargs):
        masks.append(mask)
        return original(x, mask=mask, **kwargs)

    model.backbone.forward_mst = spy
    views = crops(batch=2, n_local=2)
    losses = model.loss(views, [])
    with torch.no_grad():
        attn = model.teacher.module[0].forward_mst(torch.cat(views[:2]), with_attn=True).attn
    assert masks[1] is None                       # local crops are never masked
    torch.testing.assert_close(masks[0], attention_mask(attn, num=4, p=1.0))
    assert masks[0].sum(dim=1).tolist() == [4] * 4
    assert {'loss_dino', 'loss_restore', 'teacher_entropy', 'teacher_student_kl'} <= set(losses)
    (losses['loss_dino'] + losses['loss_restore']).backward()
    assert model.backbone.mask_token.grad.abs().sum() > 0
    assert model.decoder_head.decoder[0].conv.weight.grad is not None


def test_swin_decoder_must_span_the_last_stage_stride():
    # The last stage has stride 8: three 2x stages, not the four of a 16-px ViT patch.
    with pytest.raises(ValueError, match='give decoder_head.channels 3 stages'):
        swin_mst(decoder_head=dict(type='ImageDecoderHead', in_channels=32,
                                   channels=(16, 8, 8, 8)))


def legacy_swin_state_dict(prefix: str = '') -> tuple:
    """A version-1 mmpretrain Swin state dict: the last norm saved as ``norm.*``, and a
    stale ``attn_mask`` buffer that versions before 3 saved."""
    torch.manual_seed(1)
    source = tiny_swin(use_mask_token=False)
    legacy = OrderedDict()
    for key, value in source.state_dict().items():
        legacy_key = 'norm.' + key[len('norm1.'):] if key.startswith('norm1.') else key
        legacy[prefix + legacy_key] = value
    legacy[prefix + 'stages.1.blocks.1.attn.attn_mask'] = torch.zeros(4, 16, 16)
    legacy._metadata = OrderedDict({prefix[:-1]: dict(version=1)})
    return legacy, source.state_dict()


@pytest.mark.parametrize('prefix', ['', 'backbone.'])
def test_legacy_swin_checkpoint_loads_into_mask_swin_as_into_swin_transformer(prefix):
    from mmpretrain.models import SwinTransformer

    legacy, expected = legacy_swin_state_dict(prefix)
    assert not any(k.startswith(prefix + 'norm1.') for k in legacy)
    kwargs = {k: v for k, v in TINY_SWIN.items() if k != 'type'}
    loaded = {}
    for name, backbone in (('stock', SwinTransformer(**kwargs)),
                           ('ours', MaskSwin(**kwargs, use_mask_token=False)),
                           ('student', MaskSwin(**kwargs))):
        model = torch.nn.Module()
        model.backbone = backbone
        target = model if prefix else backbone
        result = target.load_state_dict(legacy, strict=False)
        loaded[name] = backbone.state_dict()
        missing = ['mask_token'] if name == 'student' else []
        assert [k[len(prefix):] for k in result.missing_keys] == missing, name
        assert result.unexpected_keys == [], name
    for key, value in expected.items():
        torch.testing.assert_close(loaded['stock'][key], value, rtol=0, atol=0, msg=key)
        torch.testing.assert_close(loaded['ours'][key], value, rtol=0, atol=0, msg=key)
        torch.testing.assert_close(loaded['student'][key], value, rtol=0, atol=0, msg=key)


def test_current_checkpoint_round_trips_without_conversion():
    # MaskSwin saves version 3 (inherited), so its own checkpoints are never converted; one
    # loaded without metadata (version None, as mmengine's prefix loading gives) has no
    # legacy keys to convert either.
    swin = tiny_swin()
    state = swin.state_dict()
    assert state._metadata['']['version'] == 3
    for source in (state, dict(state)):
        torch.manual_seed(2)
        other = MODELS.build(TINY_SWIN)
        other.load_state_dict(source, strict=True)
        for key, value in state.items():
            torch.testing.assert_close(other.state_dict()[key], value, rtol=0, atol=0)
