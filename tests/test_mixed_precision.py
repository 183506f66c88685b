"""optim_wrapper.mixed_precision: mixed precision by default on a GPU, float32 on a CPU."""
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.engine import DINOAmpOptimWrapper, DINOOptimWrapper
from mst_mm.engine.mixed_precision import resolve_mixed_precision
from tests.conftest import cpu_mixed_precision_training, tiny_mst_cfg
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
