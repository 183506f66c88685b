"""MST.loss(): Algorithm 2 end to end on a tiny ViT."""
import pytest
import torch
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.models import attention_mask
from tests.conftest import crops, tiny_mst_cfg


def build(**overrides):
    torch.manual_seed(0)
    model = MODELS.build(tiny_mst_cfg(**overrides))
    model.init_weights()
    return model.train()


def test_loss_returns_both_weighted_terms(message_hub):
    diagnostics = {'teacher_entropy', 'teacher_student_kl', 'prototypes_in_use',
                   'masked_fraction'}
    losses = build().loss(crops(), [])
    assert set(losses) == {'loss_dino', 'loss_restore'} | diagnostics
    assert all(torch.isfinite(v) and v.ndim == 0 for v in losses.values())
    no_decoder = build(decoder_head=None).loss(crops(), [])
    assert set(no_decoder) == {'loss_dino'} | diagnostics
    # Logged, not optimised: only the two weighted terms make up the total.
    total, log_vars = build().parse_losses(losses)
    torch.testing.assert_close(total, losses['loss_dino'] + losses['loss_restore'])
    assert diagnostics <= set(log_vars)


def test_teacher_pairs_by_name_without_mask_token_decoder_or_drop_path():
    model = build()
    teacher_names = set(model.teacher.avg_parameters)
    student_names = {n for n, _ in torch.nn.Sequential(model.backbone, model.neck)
                     .named_parameters()}
    assert teacher_names == student_names - {'0.mask_token'}
    assert not any('decoder' in n for n in teacher_names)
    drop_paths = [m.drop_prob for m in model.teacher.module.modules() if hasattr(m, 'drop_prob')]
    assert drop_paths and max(drop_paths) == 0
    assert all(not p.requires_grad for p in model.teacher.parameters())


def test_student_global_crops_are_masked_by_the_teachers_attention(message_hub):
    model = build(mask_cfg=dict(num=4, p=1.0, mode='attention'))
    calls = []
    original = model.backbone.forward_mst

    def spy(x, mask=None, **kwargs):
        calls.append((x.shape, None if mask is None else mask.clone(), kwargs))
        return original(x, mask=mask, **kwargs)

    model.backbone.forward_mst = spy
    views = crops(batch=2, n_local=2)
    model.loss(views, [])
    global_call, local_call = calls
    assert global_call[0][0] == 4 and local_call[0][0] == 4 and local_call[0][-1] == 16
    assert local_call[1] is None
    # Only the decoder reads patch features: the local crops are run for their CLS token.
    assert global_call[2] == dict(with_patches=True)
    assert local_call[2] == dict(with_patches=False)
    with torch.no_grad():
        attn = model.teacher.module[0].forward_mst(torch.cat(views[:2]), with_attn=True).attn
    torch.testing.assert_close(global_call[1], attention_mask(attn, num=4, p=1.0))
    assert global_call[1].sum(dim=1).tolist() == [4] * 4


def test_bn_statistics_of_the_neck_come_from_global_views_only(message_hub):
    model = build()
    seen = []
    original = model.neck._mlp   # the BN part of the neck; the last layer runs once

    def spy(x, update_bn_stats=True):
        seen.append((x.shape[0], update_bn_stats))
        return original(x, update_bn_stats=update_bn_stats)

    model.neck._mlp = spy
    model.loss(crops(batch=4, n_local=3), [])
    assert seen == [(8, True), (12, False)]


def test_bad_values_fail_at_build_time():
    with pytest.raises(ValueError, match='num'):
        build(mask_cfg=dict(num=0))
    with pytest.raises(ValueError, match='mode'):
        build(mask_cfg=dict(mode='bert'))
    # Patch 8 needs three 2x stages; two would restore a quarter-size image.
    with pytest.raises(ValueError, match='give decoder_head.channels 3 stages'):
        build(decoder_head=dict(type='ImageDecoderHead', in_channels=32, channels=(8, 8)))
    with pytest.raises(ValueError, match='loss_weight'):
        build(head=dict(type='DINODistillHead', out_channels=128, loss_weight=-1.0))
