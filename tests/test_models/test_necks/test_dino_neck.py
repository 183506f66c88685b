"""DINONeck: MLP, L2 norm, weight-normalised last layer; BN statistics from globals only."""
import pytest
import torch
import torch.nn.functional as F

from mst_mm.models import DINONeck


def tiny_neck(**kwargs):
    torch.manual_seed(0)
    neck = DINONeck(in_channels=16, hidden_channels=32, bottleneck_channels=8,
                    out_channels=64, **kwargs)
    neck.init_weights()
    return neck


def test_structure_and_output_equals_formula():
    neck = tiny_neck().eval()
    x = torch.randn(5, 16)
    z = F.normalize(neck.mlp(x), dim=-1)
    v = neck.last_layer.parametrizations.weight.original1
    expected = z @ (v / v.norm(dim=1, keepdim=True)).t()  # g = 1, frozen
    torch.testing.assert_close(neck(x), expected)
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in neck.mlp) == 2
    assert sum(isinstance(m, torch.nn.Linear) for m in neck.mlp) == 3
    assert not neck.last_layer.parametrizations.weight.original0.requires_grad
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in tiny_neck(with_bn=False).mlp)


def test_local_crops_leave_bn_statistics_unchanged():
    neck = tiny_neck().train()
    bns = [m for m in neck.mlp if isinstance(m, torch.nn.BatchNorm1d)]
    neck(torch.randn(8, 16))  # global views update the statistics
    before = [(bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
              for bn in bns]
    out_local = neck(torch.randn(8, 16) * 5 + 3, update_bn_stats=False)
    for bn, (mean, var, count) in zip(bns, before):
        torch.testing.assert_close(bn.running_mean, mean)
        torch.testing.assert_close(bn.running_var, var)
        assert int(bn.num_batches_tracked) == count
        assert bn.track_running_stats
    assert torch.isfinite(out_local).all()
    neck(torch.randn(8, 16) * 5 + 3)
    assert not torch.allclose(bns[0].running_mean, before[0][0])


def test_forward_crops_all_crops_is_one_bn_pass_over_every_crop():
    """DINO's head with use_bn=True: one batch of all crops, normalised together."""
    global_feat, local_feats = torch.randn(6, 16), [torch.randn(4, 16) * 3 + 1]
    dino, reference = tiny_neck(bn_statistics='all_crops').train(), tiny_neck().train()
    everything = torch.cat([global_feat, *local_feats])
    out = dino.forward_crops(global_feat, local_feats)
    torch.testing.assert_close(out, reference(everything))
    first_bn = next(m for m in dino.mlp if isinstance(m, torch.nn.BatchNorm1d))
    hidden = dino.mlp[0](everything)
    torch.testing.assert_close(first_bn.running_mean, 0.1 * hidden.detach().mean(0))
    # ... which the MST rule does not: its globals are normalised on their own.
    assert not torch.allclose(tiny_neck().train().forward_crops(global_feat, local_feats), out)


def test_bad_bn_statistics_is_refused():
    with pytest.raises(ValueError, match="bn_statistics must be one of"):
        tiny_neck(bn_statistics='local')


def test_norm_last_layer_false_trains_the_magnitude():
    neck = tiny_neck(norm_last_layer=False).train()
    magnitude = neck.last_layer.parametrizations.weight.original0
    assert magnitude.requires_grad and torch.equal(magnitude, torch.ones_like(magnitude))
    neck(torch.randn(4, 16)).pow(2).sum().backward()
    assert magnitude.grad is not None and magnitude.grad.abs().sum() > 0
