"""What must stay float32 when mmengine's optimiser wrapper trains under autocast.

A GPU step runs inside ``torch.autocast`` (bfloat16 or float16); on the CPU,
``torch.autocast('cpu', torch.bfloat16)`` casts the same operations (matrix products, linear
layers, convolutions) and so shows the same losses of precision. Each test runs one part of
the step inside bfloat16 autocast and compares it with a reference computed outside
autocast: the views, the prototype logits that DINO sharpens, and the attention that ranks
the patches for the mask.
"""
import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.models.backbones.mask_swin import pooled_query_attention, pooled_similarity
from mst_mm.models.backbones.mask_vit import encoder_layer_with_cls_attention
from tests.helpers import REPO

DEIT_S = str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
ANIMALS = str(REPO / 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py')


def bfloat16_autocast():
    return torch.autocast('cpu', dtype=torch.bfloat16)


def _preprocessor(config: str):
    return MODELS.build(Config.fromfile(config).model.data_preprocessor).train()


def _views_twice(preprocessor, inputs) -> tuple:
    """The preprocessor's training output from the same random state, outside and inside
    bfloat16 autocast."""
    torch.manual_seed(0)
    plain = preprocessor(dict(inputs=inputs, data_samples=None), training=True)['inputs']
    torch.manual_seed(0)
    with bfloat16_autocast():
        cast = preprocessor(dict(inputs=inputs, data_samples=None), training=True)['inputs']
    return plain, cast


@pytest.mark.parametrize('config,what', [(DEIT_S, 'worker views (BatchViewAugment)'),
                                         (ANIMALS, 'whole images (BatchMultiCrop)')])
def test_views_are_made_in_float32_under_autocast_bit_for_bit(config, what):
    """Flip, jitter, grey, blur (a matrix product), solarise, the crops' resize (two
    matrix products) and the normalisation: the same float32 views, bit for bit."""
    gen = torch.Generator().manual_seed(1)
    if 'BatchViewAugment' in what:
        inputs = [torch.randint(0, 256, (4, 3, s, s), generator=gen, dtype=torch.uint8)
                  for s in (48, 48, 24, 24)]
    else:
        inputs = torch.randint(0, 256, (4, 3, 32, 32), generator=gen, dtype=torch.uint8)
    plain, cast = _views_twice(_preprocessor(config), inputs)
    assert len(plain) == len(cast) >= 4
    for view, cast_view in zip(plain, cast):
        assert cast_view.dtype == torch.float32
        assert torch.equal(view, cast_view)


def test_the_check_sees_bfloat16_views():
    """The comparison above fails where a view is computed in bfloat16: the blur's matrix
    product under autocast, as the preprocessor ran it before."""
    from mst_mm.models.utils.view_ops import blur_weights
    torch.manual_seed(0)
    x = torch.randint(0, 256, (4, 3, 32, 32)).float()
    kernel = blur_weights(torch.full((4, ), 1.5), 32, 2.0)[:, None]
    plain = (kernel @ x @ kernel.transpose(-1, -2)).round()
    with bfloat16_autocast():
        cast = (kernel @ x @ kernel.transpose(-1, -2)).float().round()
    assert not torch.equal(plain, cast)


def _dino_neck():
    neck_cfg = Config.fromfile(DEIT_S).model.neck
    torch.manual_seed(0)
    neck = MODELS.build(dict(neck_cfg, out_channels=4096)).train()
    neck.init_weights()
    return neck


def test_the_prototype_layer_puts_out_float32_under_autocast():
    neck = _dino_neck()
    features = torch.randn(8, neck_in := neck.mlp[0].in_features)
    assert neck_in == 384
    with bfloat16_autocast():
        bottleneck = neck.mlp(features)
        logits = neck(features)
    assert bottleneck.dtype == torch.bfloat16  # the MLP is left to autocast
    assert logits.dtype == torch.float32


def test_the_teachers_sharpened_distribution_is_float32s_from_the_same_bottleneck():
    """softmax((logits - c) / 0.04) under autocast against a float32 forward of the same
    bottleneck features: float32's tolerance; a bfloat16 last layer is far outside it."""
    neck = _dino_neck().eval()
    torch.manual_seed(1)
    centre = 0.01 * torch.randn(1, neck.last_layer.out_features)
    with bfloat16_autocast():
        bottleneck = neck.mlp(torch.randn(8, 384))
        logits = neck._prototypes(bottleneck)
    reference = neck._prototypes(bottleneck.float())    # outside autocast

    def sharpened(x):
        return torch.softmax((x.float() - centre) / 0.04, dim=-1)

    torch.testing.assert_close(sharpened(logits), sharpened(reference), rtol=1e-5, atol=1e-7)
    with bfloat16_autocast():  # what the last layer gave under autocast before
        rounded = neck.last_layer(torch.nn.functional.normalize(bottleneck, dim=-1))
    assert rounded.dtype == torch.bfloat16
    assert (sharpened(rounded) - sharpened(reference)).abs().max() > 1e3 * (
        sharpened(logits) - sharpened(reference)).abs().max()


def _vit_last_layer_and_input():
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='MaskViT', arch='deit-small', img_size=64,
                                 patch_size=16, dino_init=True))
    backbone.init_weights()
    backbone.eval()
    return backbone.layers[-1], torch.randn(2, 17, 384)


@pytest.mark.parametrize('cls_only', [True, False])
def test_vit_guidance_is_float32_under_autocast(cls_only):
    layer, x = _vit_last_layer_and_input()
    with torch.no_grad():
        with bfloat16_autocast():
            _, guidance = encoder_layer_with_cls_attention(layer, x, cls_only=cls_only)
        _, reference = encoder_layer_with_cls_attention(layer, x, cls_only=cls_only)
    assert guidance.dtype == torch.float32 and guidance.shape == (2, 6, 16)
    torch.testing.assert_close(guidance, reference, rtol=1e-5, atol=1e-7)
    # The scores from bfloat16 projections differ far beyond that tolerance.
    with torch.no_grad(), bfloat16_autocast():
        attn = layer.attn
        qkv = attn.qkv(layer.ln1(x)).reshape(2, 17, 3, attn.num_heads, attn.head_dims)
        q, k, _ = qkv.permute(2, 0, 3, 1, 4)
        scores = (q[:, :, :1] @ k.transpose(-2, -1)) * attn.head_dims**-0.5
        cast = scores.float().softmax(-1)[:, :, 0, 1:]
    assert (cast - reference).abs().max() > 100 * (guidance - reference).abs().max()


def test_swin_guidance_is_float32_under_autocast():
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='MaskSwin', arch='tiny', img_size=64))
    backbone.init_weights()
    backbone.eval()
    block = backbone.stages[-1].blocks[-1]
    x = torch.randn(2, 4, 768)
    with torch.no_grad():
        with bfloat16_autocast():
            query_attention = pooled_query_attention(block, x)
            similarity = pooled_similarity(x.bfloat16())
        query_reference = pooled_query_attention(block, x)
        similarity_reference = pooled_similarity(x.bfloat16().float())
    assert query_attention.dtype == similarity.dtype == torch.float32
    torch.testing.assert_close(query_attention, query_reference, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(similarity, similarity_reference, rtol=1e-5, atol=1e-7)


def test_the_teacher_in_a_step_ranks_with_float32_guidance(message_hub):
    """Through MST's own teacher pass under autocast: the attention handed to the mask
    rule is float32."""
    from tests.conftest import crops, tiny_mst_cfg
    torch.manual_seed(0)
    model = MODELS.build(tiny_mst_cfg())
    model.init_weights()
    seen = []
    rule = model._mask
    model._mask = lambda feats: seen.append(feats.attn.dtype) or rule(feats)
    with bfloat16_autocast():
        model.loss(crops(), [])
    assert seen == [torch.float32]
