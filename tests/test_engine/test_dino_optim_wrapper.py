"""DINOOptimWrapper: DINO's per-parameter clipping and the cancelled gradients of frozen
parameters, checked against the rules written out by hand."""
import copy
import math

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.engine import AMP_OPTIM_WRAPPERS
from tests.conftest import tiny_mst_cfg
from tests.helpers import REPO, load_tool, mmlogger_records

MAX_NORM = 1.0


def model_with_grads():
    """Three tensors whose gradient norms are 0.5 (kept), 2.0 and 5.0 (both clipped)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2, bias=False))
    for param, norm in zip(model.parameters(), (2.0, 0.5, 5.0)):
        grad = torch.randn_like(param)
        param.grad = grad * (norm / grad.norm())
    return model


def sgd_wrapper(model, **clip):
    cfg = dict(type='DINOOptimWrapper', optimizer=dict(type='SGD', lr=1.0))
    return build_optim_wrapper(model, dict(cfg, clip_grad=clip) if clip else cfg)


def dino_clip_by_hand(grads, max_norm):
    """DINO's rule: each tensor scaled by max_norm / (norm + 1e-6) when that is below 1."""
    clipped = []
    for g in grads:
        coef = max_norm / (g.norm(2).item() + 1e-6)
        clipped.append(g * coef if coef < 1 else g.clone())
    return clipped


def test_per_parameter_clipping_equals_dinos_rule_and_logs_the_norm():
    model = model_with_grads()
    grads = [p.grad.clone() for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    wrapper = sgd_wrapper(model, type='per_param', max_norm=MAX_NORM)
    wrapper.step()   # SGD, lr 1: the update is minus the clipped gradient
    for p, p0, expected in zip(model.parameters(), before, dino_clip_by_hand(grads, MAX_NORM)):
        torch.testing.assert_close(p0 - p.detach(), expected, rtol=1e-6, atol=1e-7)
        assert p.grad.norm() <= MAX_NORM + 1e-5 or torch.equal(p.grad, expected)
    unclipped = list(model.parameters())[1]
    assert torch.equal(unclipped.grad, grads[1])   # below the threshold: untouched
    # Kept as tensors for the logger (read after the step), given once.
    stats = wrapper.pop_grad_stats()
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in stats.values())
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in grads))
    assert float(stats['grad_norm']) == pytest.approx(total, rel=1e-6)
    assert float(stats['grad_clipped_ratio']) == pytest.approx(2 / 3)
    assert wrapper.pop_grad_stats() == {}


def test_global_norm_clipping_stays_available_and_differs_from_dinos():
    per_param, global_norm = model_with_grads(), model_with_grads()
    sgd_wrapper(per_param, type='per_param', max_norm=MAX_NORM).step()
    sgd_wrapper(global_norm, type='norm', max_norm=MAX_NORM).step()
    grads = [p.grad.clone() for p in model_with_grads().parameters()]
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in grads))
    for p, g in zip(global_norm.parameters(), grads):   # one factor for every tensor
        torch.testing.assert_close(p.grad, g * (MAX_NORM / (total + 1e-6)))
    assert not torch.allclose(per_param[0].weight, global_norm[0].weight)


def test_frozen_parameters_get_gradients_but_no_update_and_no_weight_decay():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    wrapper = build_optim_wrapper(model, dict(
        type='DINOOptimWrapper', optimizer=dict(type='AdamW', lr=0.1, weight_decay=0.5),
        clip_grad=dict(type='per_param', max_norm=3.0)))
    frozen = list(model[1].parameters())
    before = [p.detach().clone() for p in model.parameters()]

    wrapper.freeze(frozen)
    model(torch.randn(8, 4)).pow(2).sum().backward()
    assert all(p.grad is not None for p in frozen)   # backward reaches them (DDP needs it)
    wrapper.step()
    wrapper.zero_grad()
    for p, p0 in zip(frozen, before[2:]):
        assert torch.equal(p, p0)
        assert p not in wrapper.optimizer.state   # AdamW skipped it: no moments, no decay
    assert not torch.equal(model[0].weight, before[0])

    wrapper.freeze([])
    wrapper.update_params(model(torch.randn(8, 4)).pow(2).sum())
    assert not torch.equal(model[1].weight, before[2])


@pytest.mark.parametrize('clip_grad', [dict(type='per_param'),
                                       dict(type='per_param', max_norm=0.0),
                                       dict(type='per_param', max_norm=3.0, norm_type=1)])
def test_bad_per_parameter_options_are_refused(clip_grad):
    with pytest.raises(ValueError, match="type='per_param'"):
        sgd_wrapper(nn.Linear(2, 2), **clip_grad)


def test_mst_configs_use_dinos_rules_and_amp_keeps_them(tmp_path):
    config = str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
    cfg = Config.fromfile(config)
    assert cfg.optim_wrapper.type == 'DINOOptimWrapper'
    assert cfg.optim_wrapper.clip_grad == dict(type='per_param', max_norm=3.0)
    # The frozen last layer still gets its gradient: DDP needs no search for unused ones.
    assert cfg.get('model_wrapper_cfg', {}).get('find_unused_parameters', False) is False

    train = load_tool('tools/train.py')
    args = train.parse_args([config, '--amp', '--work-dir', str(tmp_path)])
    amp_cfg = train.merge_args(Config.fromfile(args.config), args)
    assert amp_cfg.optim_wrapper.type == 'DINOAmpOptimWrapper'
    assert amp_cfg.optim_wrapper.clip_grad.type == 'per_param'
    assert AMP_OPTIM_WRAPPERS['OptimWrapper'] == 'AmpOptimWrapper'
    with pytest.raises(ValueError, match='no mixed-precision counterpart'):
        train.merge_args(Config(dict(optim_wrapper=dict(type='Custom'))), args)


def test_fused_adamw_becomes_foreach_where_this_torch_has_none_with_equal_updates(
        monkeypatch):
    """The recipe asks for fused AdamW; on a torch without a fused kernel for the device
    (the CPU before 2.4) the constructor builds foreach AdamW, and says so. Both give the
    same update up to float rounding."""
    from mmengine.registry import init_default_scope

    from mst_mm.compat import fused_supported
    from mst_mm.engine import optim_constructor
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(f'{REPO}/configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
    optim_cfg = dict(cfg.optim_wrapper, mixed_precision=None)
    assert optim_cfg['optimizer']['fused'] is True

    def build(fused_kernel: bool):
        monkeypatch.setattr(optim_constructor, 'fused_supported',
                            lambda optimizer, device: fused_kernel and fused_supported(
                                optimizer, device))
        torch.manual_seed(0)
        model = MODELS.build(tiny_mst_cfg())
        with mmlogger_records() as records:
            wrapper = build_optim_wrapper(model, copy.deepcopy(optim_cfg))
        return model, wrapper, [r.getMessage() for r in records]

    native, native_wrapper, _ = build(True)
    fallback, fallback_wrapper, messages = build(False)
    defaults = fallback_wrapper.optimizer.defaults
    assert defaults['foreach'] is True and not defaults.get('fused')
    assert any('using foreach=True' in m and 'instead of fused=True' in m for m in messages)
    if fused_supported(torch.optim.AdamW, torch.device('cpu')):
        assert native_wrapper.optimizer.defaults['fused'] is True
    for _ in range(3):
        for model, wrapper in ((native, native_wrapper), (fallback, fallback_wrapper)):
            torch.manual_seed(1)
            for param in model.parameters():
                param.grad = torch.randn_like(param)
            wrapper.step()
    for (name, a), b in zip(native.named_parameters(), fallback.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
