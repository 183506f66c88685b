"""optim_wrapper.mixed_precision: mixed precision by default on a GPU, float32 on a CPU.

Mixed precision without a GPU: the MST training step under ``torch.autocast('cpu',
bfloat16)`` with torch's CPU ``GradScaler``, through ``DINOAmpOptimWrapper``, and the same
config after mmpretrain's ``tools/train.py --amp``.

mmengine's ``AmpOptimWrapper`` asserts a GPU when it is built and takes its ``GradScaler``
from ``torch.cuda.amp``. The ``cpu_amp`` fixture lifts only that assertion and hands it
torch's CPU ``GradScaler``: mmengine's scaling, unscaling, skipping and back-off, and DINO's
rules on top of them, run as they would on a GPU, in bfloat16 instead of float16.
"""
import copy
import functools

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.optim.optimizer import amp_optimizer_wrapper
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.engine import DINOAmpOptimWrapper, DINOOptimWrapper
from mst_mm.engine.mixed_precision import resolve_mixed_precision
from tests.conftest import cpu_mixed_precision_training, crops, tiny_mst_cfg
from tests.helpers import REPO

WRAPPER = dict(type='DINOOptimWrapper', optimizer=dict(type='AdamW', lr=1e-3))


@pytest.fixture
def gpu(monkeypatch):
    """A stand-in CUDA GPU for the choice: ``gpu(capability=(major, minor))``. It claims
    bfloat16 support whatever its capability, as ``torch.cuda.is_bf16_supported()`` does
    where bfloat16 is only emulated."""
    def make(capability=(8, 0), name: str = 'NVIDIA A100-SXM4-80GB') -> list:
        precision = []
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)  # mmengine's log line asks
        monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a, **k: capability)
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a, **k: name)
        monkeypatch.setattr(torch, 'set_float32_matmul_precision', precision.append)
        return precision
    return make


@pytest.fixture
def logged(monkeypatch):
    """The messages that mixed_precision logs."""
    from mst_mm.engine import mixed_precision
    messages = []
    monkeypatch.setattr(mixed_precision, 'print_log', lambda msg, **kwargs: messages.append(msg))
    return messages


@pytest.mark.parametrize('capability,name', [((8, 0), 'NVIDIA A100-SXM4-80GB'),
                                             ((9, 0), 'NVIDIA H100 80GB HBM3'),
                                             ((8, 9), 'NVIDIA L4')])
def test_auto_is_bfloat16_without_a_scaler_where_the_gpu_runs_it_natively(
        gpu, logged, capability, name):
    gpu(capability, name)
    cfg = resolve_mixed_precision(dict(WRAPPER, mixed_precision='auto'))
    assert cfg == dict(WRAPPER, type='DINOAmpOptimWrapper', dtype='bfloat16',
                       loss_scale=dict(enabled=False))
    major, minor = capability
    assert logged == [f'Training in mixed precision, bfloat16 (auto: {name}, compute '
                      f'capability {major}.{minor} runs bfloat16 natively; '
                      'optim_wrapper.mixed_precision=None trains in float32).']


@pytest.mark.parametrize('capability,name', [((7, 0), 'Tesla V100-SXM2-32GB'),
                                             ((7, 5), 'Tesla T4'), ((6, 1), 'Tesla P40')])
def test_auto_is_float16_with_dynamic_scaling_where_bfloat16_is_only_emulated(
        gpu, logged, capability, name):
    gpu(capability, name)
    cfg = resolve_mixed_precision(dict(WRAPPER, mixed_precision='auto'))
    assert cfg == dict(WRAPPER, type='DINOAmpOptimWrapper', dtype='float16',
                       loss_scale='dynamic')
    assert len(logged) == 1 and logged[0].startswith('Training in mixed precision, float16 ')
    major, minor = capability
    assert f'{name}, compute capability {major}.{minor} has no bfloat16 tensor cores' in logged[0]


def test_an_explicit_choice_is_kept_on_any_gpu(gpu, logged):
    gpu((7, 0), 'Tesla V100-SXM2-32GB')
    cfg = resolve_mixed_precision(dict(WRAPPER, mixed_precision='bfloat16'))
    assert cfg['dtype'] == 'bfloat16' and cfg['loss_scale'] == dict(enabled=False)
    assert '(optim_wrapper.mixed_precision;' in logged[0]


def test_float32_turns_tf32_on_only_on_a_gpu(gpu, monkeypatch):
    precision = gpu()
    assert resolve_mixed_precision(dict(WRAPPER, mixed_precision=None)) == WRAPPER
    assert precision == ['high']
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    precision.clear()
    assert resolve_mixed_precision(dict(WRAPPER, mixed_precision=None)) == WRAPPER
    assert precision == []


def test_auto_on_a_cpu_is_float32_and_amp_wrappers_are_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert resolve_mixed_precision(dict(WRAPPER, mixed_precision='auto')) == WRAPPER
    amp = dict(WRAPPER, type='DINOAmpOptimWrapper', loss_scale='dynamic')
    assert resolve_mixed_precision(dict(amp, mixed_precision='auto')) == amp  # --amp wins
    assert resolve_mixed_precision(dict(WRAPPER, mixed_precision='float16'))['dtype'] == 'float16'
    with pytest.raises(ValueError, match='mixed_precision must be one of'):
        resolve_mixed_precision(dict(WRAPPER, mixed_precision='fp16'))
    with pytest.raises(ValueError, match='mixed-precision counterpart'):
        resolve_mixed_precision(dict(WRAPPER, type='ZeroRedundancyOptimizer',
                                     mixed_precision='bfloat16'))


@pytest.mark.parametrize('config', ['configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py',
                                    'configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py'])
def test_the_imagenet_configs_ask_for_mixed_precision_and_build_float32_on_a_cpu(
        config, monkeypatch):
    cfg = Config.fromfile(f'{REPO}/{config}')
    assert cfg.optim_wrapper.mixed_precision == 'auto'
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    init_default_scope('mmpretrain')
    model = MODELS.build(tiny_mst_cfg())
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert type(wrapper) is DINOOptimWrapper


@cpu_mixed_precision_training
def test_the_bfloat16_choice_builds_and_steps_without_a_loss_scale(monkeypatch):
    from mmengine.optim.optimizer import amp_optimizer_wrapper
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    init_default_scope('mmpretrain')
    model = MODELS.build(tiny_mst_cfg())
    wrapper = build_optim_wrapper(model, dict(
        WRAPPER, constructor='StudentOptimWrapperConstructor', mixed_precision='bfloat16'))
    assert type(wrapper) is DINOAmpOptimWrapper and wrapper.cast_dtype == torch.bfloat16
    assert not wrapper.loss_scaler.is_enabled()


def test_bfloat16_on_the_cpu_is_refused_where_torchs_cpu_attention_corrupts_memory(
        monkeypatch):
    from mst_mm.engine import mixed_precision
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(mixed_precision, 'CPU_BFLOAT16_BACKWARD_CORRUPTS', True)
    with pytest.raises(ValueError, match=r'corrupts memory.*mixed_precision=None.*torch 2.2'):
        resolve_mixed_precision(dict(WRAPPER, mixed_precision='bfloat16'))
    assert resolve_mixed_precision(dict(WRAPPER, mixed_precision='auto')) == WRAPPER


# -- the training step under CPU autocast -------------------------------------------------

INIT_SCALE = 2.0**16


@pytest.fixture
def cpu_amp(monkeypatch):
    init_default_scope('mmpretrain')  # where the configs' constructor is registered
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(amp_optimizer_wrapper, 'GradScaler',
                        functools.partial(torch.amp.GradScaler, 'cpu'))


def wrapper_cfg(wrapper: str, max_norm: float = 3.0) -> dict:
    cfg = dict(type=wrapper, constructor='StudentOptimWrapperConstructor',
               optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.04),
               clip_grad=dict(type='per_param', max_norm=max_norm))
    if wrapper == 'DINOAmpOptimWrapper':
        cfg.update(dtype='bfloat16', loss_scale=dict(init_scale=INIT_SCALE))
    return cfg


def build(wrapper: str, max_norm: float = 3.0, seed: int = 0):
    torch.manual_seed(seed)
    model = MODELS.build(tiny_mst_cfg())
    model.init_weights()
    return model, build_optim_wrapper(model, wrapper_cfg(wrapper, max_norm))


def backward_and_step(model, optim_wrapper, autocast: bool, scale_loss_by: float = 1.0):
    """One training step up to the update, the gradients kept for inspection."""
    torch.manual_seed(1)  # the same masks and drop-path on every side
    context = (optim_wrapper.optim_context(model) if isinstance(optim_wrapper,
                                                                DINOAmpOptimWrapper)
               else torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast))
    with context:
        losses = model.loss(crops(), [])
    # Our casts ([MASK] insertion, attention, the losses) hand float32 losses to the scaler.
    assert all(v.dtype == torch.float32 for v in losses.values())
    loss = sum(losses.values()) * scale_loss_by
    optim_wrapper.backward(optim_wrapper.scale_loss(loss))
    optim_wrapper.step()
    return {k: float(v) for k, v in losses.items()}


def student_grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def student_parameters(model) -> dict:
    """Copies of what the optimiser updates (the EMA teacher follows in ``loss``)."""
    return {name: param.detach().clone() for name, param in model.named_parameters()
            if not name.startswith('teacher.')}


@cpu_mixed_precision_training
def test_bf16_losses_and_gradients_are_close_to_fp32(cpu_amp, message_hub):
    # bfloat16 keeps 8 bits of mantissa (relative rounding 2**-9 per operation); through two
    # small ViT layers, the heads and the losses the errors stay near 1 %: the tolerances
    # below are a few times that, and far below what a wrong cast or scale would give.
    fp32_model, fp32_wrapper = build('DINOOptimWrapper', max_norm=1e9)
    amp_model, amp_wrapper = build('DINOAmpOptimWrapper', max_norm=1e9)
    fp32 = backward_and_step(fp32_model, fp32_wrapper, autocast=False)
    amp = backward_and_step(amp_model, amp_wrapper, autocast=True)
    losses = [key for key in fp32 if key.startswith('loss')]
    assert losses
    for key in losses:
        assert amp[key] == pytest.approx(fp32[key], rel=2e-2), key
    assert amp_model.backbone.mask_token.grad is not None   # [MASK] is trained under AMP too
    g32, g16 = student_grads(fp32_model), student_grads(amp_model)
    assert torch.cosine_similarity(g32, g16, dim=0) > 0.99
    assert (g16.norm() / g32.norm()).item() == pytest.approx(1.0, abs=0.05)


@cpu_mixed_precision_training
def test_gradients_are_unscaled_before_the_per_parameter_clip(cpu_amp, message_hub):
    # The same bfloat16 step, once scaled by 2**16 and unscaled by the AMP wrapper, once
    # unscaled: a power-of-two scale is exact, so the clipped gradients must agree. Clipping
    # the scaled gradients instead would leave them 2**16 times too small.
    plain_model, plain_wrapper = build('DINOOptimWrapper', max_norm=0.05)
    amp_model, amp_wrapper = build('DINOAmpOptimWrapper', max_norm=0.05)
    backward_and_step(plain_model, plain_wrapper, autocast=True)
    plain_ratio = float(plain_wrapper.pop_grad_stats()['grad_clipped_ratio'])
    backward_and_step(amp_model, amp_wrapper, autocast=True)
    amp_ratio = float(amp_wrapper.pop_grad_stats()['grad_clipped_ratio'])
    assert amp_wrapper.loss_scaler.get_scale() == INIT_SCALE  # finite: no back-off
    assert 0 < amp_ratio == plain_ratio < 1
    torch.testing.assert_close(student_grads(amp_model), student_grads(plain_model),
                               rtol=1e-5, atol=1e-9)
    for param in amp_model.parameters():
        if param.grad is not None:
            assert param.grad.norm() <= 0.05 + 1e-6


@cpu_mixed_precision_training
def test_a_step_with_inf_gradients_is_skipped_and_the_scale_backs_off(cpu_amp, message_hub):
    model, optim_wrapper = build('DINOAmpOptimWrapper')
    before = student_parameters(model)
    backward_and_step(model, optim_wrapper, autocast=True, scale_loss_by=float('inf'))
    after = student_parameters(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert optim_wrapper.loss_scaler.get_scale() == INIT_SCALE * 0.5
    assert not optim_wrapper.optimizer.state  # AdamW never stepped
    optim_wrapper.zero_grad()
    backward_and_step(model, optim_wrapper, autocast=True)  # the next finite step updates
    assert not torch.equal(before['backbone.cls_token'], model.backbone.cls_token)


@cpu_mixed_precision_training
def test_the_frozen_last_layer_stays_put_under_scaling(cpu_amp, message_hub):
    model, optim_wrapper = build('DINOAmpOptimWrapper')
    optim_wrapper.freeze(model.neck.last_layer.parameters())
    before = copy.deepcopy(model.state_dict())
    backward_and_step(model, optim_wrapper, autocast=True)
    after = model.state_dict()
    last_layer = [k for k in before if k.startswith('neck.last_layer.')]
    assert last_layer and all(torch.equal(before[k], after[k]) for k in last_layer)
    assert not torch.equal(before['neck.mlp.0.weight'], after['neck.mlp.0.weight'])
    assert optim_wrapper.loss_scaler.get_scale() == INIT_SCALE


@cpu_mixed_precision_training
def test_mmpretrains_train_py_amp_builds_dinos_amp_wrapper(cpu_amp, message_hub):
    # What mmpretrain's tools/train.py (and `mim train mmpretrain`) does with --amp.
    cfg = Config.fromfile(str(REPO / 'configs' / 'mst_deit-s_300e.py'))
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    model = MODELS.build(tiny_mst_cfg())
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert type(optim_wrapper) is DINOAmpOptimWrapper
    assert optim_wrapper.per_param_max_norm == 3.0
    cfg.optim_wrapper.type = 'OptimWrapper'
    del cfg.optim_wrapper.loss_scale
    assert type(build_optim_wrapper(model, cfg.optim_wrapper)) is DINOOptimWrapper
    cfg.optim_wrapper.type = 'ApexOptimWrapper'
    with pytest.raises(ValueError, match=r"(?s)per_param.*'ApexOptimWrapper'.*"
                                         r"Use 'DINOOptimWrapper'"):
        build_optim_wrapper(model, cfg.optim_wrapper)
