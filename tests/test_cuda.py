"""What only a GPU exercises: mixed precision through tools/train.py --amp, NCCL with torch's
SyncBatchNorm through tools/dist_train.sh, the fused SDPA kernels, device-resident masks,
EMA and k-NN, and mmdet / mmseg fine-tuning on the device.

Every test here is marked ``cuda`` and skipped where torch sees no CUDA device, so CPU CI
stays green; on a GPU machine run them with ``pytest -m cuda``.
"""
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, make_image_folder

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason='needs a CUDA device (torch.cuda.is_available() is False)'),
]

DEIT_CONFIG = REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'
SWIN_CONFIG = REPO / 'configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py'
# 16 images, batches of 8: 2 iterations an epoch.
RUN_OVERRIDES = """
custom_imports = dict(imports=['mst_mm', 'tests.cuda_probe_hooks'], allow_failed_imports=False)
train_dataloader = dict(batch_size=8, num_workers=2, persistent_workers=False,
                        dataset=dict(data_root={data_root!r}))
train_cfg = dict(max_epochs={epochs})
custom_hooks = [dict(type='TeacherTempWarmupHook', start=0.04, end=0.07, warmup_epochs=2),
                dict(type='FreezeLastLayerHook', freeze_epochs=1),
                dict(type='DeviceProbeHook')]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval={epochs}))
"""


@pytest.fixture(autouse=True)
def restore_default_scope():
    """An mmdet or mmseg Runner makes its scope the current one; later tests expect ours."""
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def write_run_config(tmp_path: Path, base: Path, epochs: int = 3, extra: str = '') -> Path:
    """``base`` on a 16-image folder for ``epochs`` epochs, with the DeviceProbeHook."""
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(64, 80))
    config = tmp_path / 'run.py'
    config.write_text(f'_base_ = [{str(base)!r}]\n'
                      + RUN_OVERRIDES.format(data_root=data_root, epochs=epochs) + extra)
    return config


def run_tool(cmd, **env) -> subprocess.CompletedProcess:
    # The repository first, then what PYTHONPATH held: on an air-gapped GPU node the stack is a
    # folder on PYTHONPATH (projects/mst_research/tools/check_gpu.sh --wheels), which the tools
    # need too.
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))
    full_env = dict(os.environ, PYTHONPATH=python_path, **env,
                    PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    result = subprocess.run([str(c) for c in cmd], cwd=REPO, env=full_env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def read_probe(work_dir: Path, rank: int = 0) -> dict:
    return json.loads((work_dir / f'device_probe_rank{rank}.json').read_text())


def assert_mst_trained_on_cuda(probe: dict, iterations: int) -> None:
    """Finite losses every iteration, everything on the GPU, the teacher moving."""
    assert len(probe['iters']) == iterations
    for it in probe['iters']:
        assert it['losses'] and all(math.isfinite(v) for v in it['losses'].values()), it
        assert it['mask']['device'].startswith('cuda') and it['mask']['dtype'] == 'torch.bool'
        assert it['mask']['source_device'].startswith('cuda'), it['mask']
    assert all(d.startswith('cuda') for d in probe['param_devices'] + probe['buffer_devices'])
    assert all(d.startswith('cuda') for d in probe['teacher_devices'])
    assert probe['center_device'].startswith('cuda') and any(probe['center'])
    # The EMA teacher followed the student after the first iteration's copy.
    assert probe['teacher_moved'] > probe['teacher_tensors'] // 2, probe['teacher_moved']


@pytest.mark.parametrize('config', [DEIT_CONFIG, SWIN_CONFIG], ids=['deit-s', 'swin-t'])
@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_train_py_amp(config, dtype, tmp_path):
    if dtype == 'bfloat16' and not torch.cuda.is_bf16_supported():
        pytest.skip('this GPU has no bfloat16')
    run_config = write_run_config(tmp_path, config, epochs=3)
    work_dir = tmp_path / 'work'
    run_tool([sys.executable, REPO / 'tools' / 'train.py', run_config, '--amp',
              '--work-dir', work_dir, '--cfg-options', f'optim_wrapper.dtype={dtype}'])
    probe = read_probe(work_dir)
    assert_mst_trained_on_cuda(probe, iterations=6)
    # autocast ran the student's linear layers in the asked precision
    assert f'torch.{dtype}' in probe['linear_dtypes'], probe['linear_dtypes']
    for it in probe['iters']:
        assert it['optim_wrapper'] == 'DINOAmpOptimWrapper'
        assert it['cast_dtype'] == f'torch.{dtype}'
        # mmengine's dynamic loss scaling is on; its scale stays a finite power of two
        scaler = it['scaler']
        assert scaler['enabled'] and scaler['type'] == 'GradScaler'
        assert scaler['scale'] > 0 and math.log2(scaler['scale']).is_integer()
    # A step skipped for an overflow halves the scale and leaves the student as it was;
    # at least one step of the six must have been taken.
    assert any(it['student_moved'] for it in probe['iters'])
    scales = [it['scaler']['scale'] for it in probe['iters']]
    for before, after, it in zip(scales, scales[1:], probe['iters'][1:]):
        assert after in (before, before / 2, before * 2), scales
        if after == before / 2:
            assert not it['student_moved'], 'an overflow step must not update the student'


def test_train_py_amp_saves_resumes_and_continues(tmp_path):
    # Runner.resume loads the checkpoint onto the GPU (map_location), the saved generator
    # states included; restoring them must not fail, and the run must go on from epoch 2.
    run_config = write_run_config(tmp_path, DEIT_CONFIG, epochs=2,
                                  extra='default_hooks = dict(checkpoint=dict(interval=1))\n')
    work_dir = tmp_path / 'work'
    run_tool([sys.executable, REPO / 'tools' / 'train.py', run_config, '--amp',
              '--work-dir', work_dir])
    assert (work_dir / 'epoch_2.pth').is_file()
    resumed = run_tool([sys.executable, REPO / 'tools' / 'train.py', run_config, '--amp',
                        '--work-dir', work_dir, '--resume',
                        '--cfg-options', 'train_cfg.max_epochs=3'])
    assert 'resumed epoch: 2' in resumed.stdout + resumed.stderr
    probe = read_probe(work_dir)
    assert_mst_trained_on_cuda(probe, iterations=2)  # epoch 3 only
    assert (work_dir / 'epoch_3.pth').is_file()


@pytest.mark.parametrize('gpus', [1, 2])
def test_dist_train_sh_nccl_sync_bn(gpus, tmp_path):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f'needs {gpus} GPUs, this machine has {torch.cuda.device_count()}')
    run_config = write_run_config(tmp_path, DEIT_CONFIG, epochs=2)
    work_dir = tmp_path / 'work'
    with socket.socket() as free:
        free.bind(('127.0.0.1', 0))
        port = free.getsockname()[1]
    run_tool(['bash', REPO / 'tools' / 'dist_train.sh', run_config, str(gpus),
              '--work-dir', work_dir], PORT=str(port))
    probes = [read_probe(work_dir, rank) for rank in range(gpus)]
    for probe in probes:
        assert probe['backend'] == 'nccl' and probe['world_size'] == gpus
        assert probe['wrapper'] == 'MMDistributedDataParallel'
        assert probe['find_unused_parameters'] is False
        # mmengine's sync_bn='torch' made every BN of the neck and the decoder torch's
        # SyncBatchNorm, left as it is on the GPU (CPUSyncBatchNorm is the gloo fallback).
        assert probe['norm_types'] == {'neck': ['SyncBatchNorm'],
                                       'decoder_head': ['SyncBatchNorm']}
        assert_mst_trained_on_cuda(probe, iterations=4 // gpus)
        # BN statistics from the global crops only: the local crops' pass normalises with
        # batch statistics under frozen_bn_statistics and leaves the running ones untouched.
        calls = probe['neck_calls']
        assert [c['update_bn_stats'] for c in calls] == [True, False] * len(probe['iters'])
        assert all(c['stats_changed'] == c['update_bn_stats'] for c in calls), calls
        # The centre's batch sum is all-reduced over the ranks, on the GPU, every iteration.
        assert len(probe['center_reduces']) == len(probe['iters'])
        assert all(r['device'].startswith('cuda') for r in probe['center_reduces'])
    if gpus > 1:
        assert probes[0]['center'] == probes[1]['center']


def attention_backend(name: str):
    """A block where ``scaled_dot_product_attention`` runs on the backend ``name`` alone
    (``'MATH'``, ``'FLASH_ATTENTION'``, ``'EFFICIENT_ATTENTION'``), raising where it cannot:
    ``torch.nn.attention.sdpa_kernel`` from torch 2.3, ``torch.backends.cuda.sdp_kernel``
    before."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_math=name == 'MATH',
                                              enable_flash=name == 'FLASH_ATTENTION',
                                              enable_mem_efficient=name == 'EFFICIENT_ATTENTION')
    return sdpa_kernel([getattr(SDPBackend, name)])


def _last_layer_input_and_attention(backbone, images, backend):
    """forward_mst under one SDPA backend; returns its features and the last layer's input."""
    captured = {}
    handle = backbone.layers[-1].ln1.register_forward_pre_hook(
        lambda module, args: captured.__setitem__('x', args[0].detach()))
    try:
        with attention_backend(backend), torch.no_grad():
            feats = backbone.forward_mst(images, with_attn=True)
    finally:
        handle.remove()
    return feats, captured['x']


def _cls_attention_by_the_book(layer, x):
    """softmax(Q K^T / sqrt(d)) of the whole matrix in float32, CLS row, patch columns."""
    attn = layer.attn
    h = layer.ln1(x)
    qkv = attn.qkv(h).reshape(x.shape[0], x.shape[1], 3, attn.num_heads, attn.head_dims)
    q, k, _ = qkv.float().permute(2, 0, 3, 1, 4)
    weights = (q @ k.transpose(-2, -1) * attn.head_dims**-0.5).softmax(dim=-1)
    return weights[:, :, 0, 1:]


@pytest.mark.parametrize('backend_name, autocast_dtype', [
    ('FLASH_ATTENTION', torch.float16), ('FLASH_ATTENTION', torch.bfloat16),
    ('EFFICIENT_ATTENTION', torch.float16), ('EFFICIENT_ATTENTION', None)])
def test_last_block_cls_attention_under_fused_sdpa_equals_the_math_path(backend_name,
                                                                        autocast_dtype):
    from mmpretrain.registry import MODELS

    import mst_mm  # noqa: F401
    if autocast_dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip('this GPU has no bfloat16')
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='MaskViT', arch='deit-small', img_size=224,
                                 patch_size=16, dino_init=True)).cuda().eval()
    backbone.init_weights()
    images = torch.randn(4, 3, 224, 224, device='cuda')
    enabled = autocast_dtype is not None
    with torch.autocast('cuda', dtype=autocast_dtype or torch.float16, enabled=enabled):
        # The fused kernel must really run: sdpa_kernel allows it alone, and SDPA raises
        # "No available kernel" instead of falling back.
        fused, fused_x = _last_layer_input_and_attention(
            backbone, images, backend_name)
        math_feats, math_x = _last_layer_input_and_attention(backbone, images, 'MATH')
    with torch.no_grad():  # outside autocast: the guidance is float32 under any autocast
        reference = _cls_attention_by_the_book(backbone.layers[-1], fused_x)
    assert fused.attn_heads.shape == (4, 6, 196) and fused.attn_heads.dtype == torch.float32
    # The explicit CLS row is the float32 attention, on the fused kernel's own input.
    torch.testing.assert_close(fused.attn_heads, reference, rtol=1e-4, atol=1e-6)
    # Fused and math paths agree through 12 blocks, up to the precision they ran in.
    tol = dict(rtol=0, atol=1e-4) if not enabled else dict(rtol=0, atol=2e-2)
    scale = math_feats.attn.abs().max()
    torch.testing.assert_close(fused.attn / scale, math_feats.attn / scale, **tol)
    feat_scale = math_feats.global_feat.abs().max()
    torch.testing.assert_close(fused.global_feat.float() / feat_scale,
                               math_feats.global_feat.float() / feat_scale, **tol)
    assert fused_x.shape == math_x.shape == (4, 197, 384)


class NoHostSync:
    """Raise on any synchronising CUDA call (a device-to-host copy, .item(), nonzero) made
    inside the block: the computation stays on the device."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode('error')

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode('default')


def test_masks_ema_and_centre_stay_on_the_device(message_hub):
    from mmpretrain.registry import MODELS

    from mst_mm.models import attention_mask
    from tests.conftest import crops, tiny_mst_cfg

    attn = torch.rand(4, 64, device='cuda')
    with NoHostSync():
        guided = attention_mask(attn, num=8, p=0.5, mode='attention')
        random = attention_mask(attn, num=8, p=0.5, mode='random')
    assert guided.device.type == random.device.type == 'cuda' and guided.dtype == torch.bool
    lowest = attn.topk(8, dim=1, largest=False).indices
    allowed = torch.zeros_like(guided).scatter_(1, lowest, True)
    assert not (guided & ~allowed).any()   # only the 1/num least attended are candidates

    torch.manual_seed(0)
    model = MODELS.build(tiny_mst_cfg()).cuda()
    model.init_weights()
    model.train()
    views = [v.cuda() for v in crops()]
    model.loss(views, [])   # step 0: the teacher becomes a copy of the student
    for p in model.backbone.parameters():
        p.data.add_(torch.randn_like(p) * 0.01)
    before = {k: v.clone() for k, v in model.teacher.avg_parameters.items()}
    student = dict(torch.nn.Sequential(model.backbone, model.neck).named_parameters())
    losses = model.loss(views, [])
    assert all(v.device.type == 'cuda' and torch.isfinite(v) for v in losses.values())
    m = 0.0 - (0.0 - 0.004) * (math.cos(math.pi * 1 / message_hub.get_info('max_iters')) + 1) / 2
    for name, old in before.items():
        new = model.teacher.avg_parameters[name]
        assert new.device.type == 'cuda'
        torch.testing.assert_close(new, (1 - m) * old + m * student[name].detach())
    assert model.teacher.steps.device.type == 'cuda'

    teacher_out = torch.randn(8, 128, device='cuda')
    center = model.head.center.clone()
    with NoHostSync():
        model.head.update_center(teacher_out)
    torch.testing.assert_close(model.head.center, 0.9 * center + 0.1 * teacher_out.mean(0))


def test_knn_scores_on_the_device_equal_the_cpu_ones():
    from mst_mm.evaluation.knn import WeightedKNNAccuracy, weighted_knn_scores

    gen = torch.Generator().manual_seed(0)
    train, query = torch.randn(300, 32, generator=gen), torch.randn(50, 32, generator=gen)
    train_labels = torch.randint(0, 5, (300,), generator=gen)
    query_labels = torch.randint(0, 5, (50,), generator=gen)
    on_cpu = weighted_knn_scores(train, train_labels, query, 5, ks=(10, 20), chunk_size=64)
    with NoHostSync():
        on_gpu = weighted_knn_scores(train.cuda(), train_labels.cuda(), query.cuda(), 5,
                                     ks=(10, 20), chunk_size=64)
    for k in (10, 20):
        assert on_gpu[k].device.type == 'cuda'
        torch.testing.assert_close(on_gpu[k].cpu(), on_cpu[k], rtol=1e-4, atol=1e-4)

    def accuracy(device):
        metric = WeightedKNNAccuracy(ks=(10, 20), chunk_size=64)
        metric.set_reference(train.to(device), train_labels.to(device))
        metric.process(None, [dict(embedding=f.to(device), gt_label=label)
                              for f, label in zip(query, query_labels)])
        return metric.compute_metrics(metric.results)

    assert accuracy('cuda') == accuracy('cpu')


def mmcv_cuda_ops_or_skip() -> None:
    try:
        from mmcv.ops import nms
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]], device='cuda')
        nms(boxes, torch.tensor([0.9, 0.8], device='cuda'), iou_threshold=0.5)
    except (ImportError, RuntimeError) as error:
        pytest.skip(f'mmcv has no CUDA ops ({str(error).splitlines()[0]}): build it on this '
                    'machine with FORCE_CUDA=1 MMCV_WITH_OPS=1 (docs/install.md)')


def train_two_downstream_iterations_on_the_gpu(cfg, tmp_path, checkpoint: str) -> dict:
    """Train a downstream config through our train.py with the device probe (two iterations,
    every parameter on the GPU, finite losses), then test ``checkpoint`` with our test.py;
    returns the test's metrics."""
    from tests import test_downstream as downstream

    cfg.custom_imports = dict(imports=['mst_mm', 'tests.cuda_probe_hooks'],
                              allow_failed_imports=False)
    cfg.custom_hooks = [dict(type='DeviceProbeHook', mst=False)]
    tested = downstream.train_and_test_with_our_tools(cfg, tmp_path, checkpoint)
    probe = read_probe(tmp_path / 'work')
    assert len(probe['iters']) == 2
    assert all(d.startswith('cuda') for d in probe['param_devices'])
    assert all(math.isfinite(v) for it in probe['iters'] for v in it['losses'].values())
    return tested


def test_mask_rcnn_two_iterations_on_the_gpu(tmp_path):
    mmcv_cuda_ops_or_skip()
    from tests import test_downstream as downstream
    from tests.downstream_data import make_tiny_coco
    from tests.helpers import scalars

    checkpoint = tmp_path / 'epoch_100.pth'
    downstream.save_mst_checkpoint('configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py',
                                   checkpoint)
    downstream.converter.main([str(checkpoint), str(tmp_path / 'swin.pth'), '--target', 'mmdet'])
    data_root = make_tiny_coco(tmp_path / 'coco') + '/'
    cfg = downstream.shrink_runner_cfg(downstream.Config.fromfile(str(downstream.DET_CONFIG)))
    cfg.model.backbone.init_cfg.checkpoint = str(tmp_path / 'swin.pth')
    cfg.model.test_cfg.rcnn.score_thr = 0.0
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = data_root
        resize = next(t for t in loader.dataset.pipeline if t.type == 'Resize')
        resize.scale = (160, 128)  # the tiny images' own sizes, as in test_downstream
    cfg.train_dataloader.batch_size = 2
    cfg.val_evaluator.ann_file = data_root + 'annotations/instances_val2017.json'
    cfg.train_cfg.max_epochs = 1
    tested = train_two_downstream_iterations_on_the_gpu(cfg, tmp_path, 'epoch_1.pth')
    # The saved checkpoint, tested again, is the model validated at the end of training.
    metrics = next(line for line in scalars(tmp_path / 'work') if 'coco/bbox_mAP' in line)
    for name in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert tested[name] == pytest.approx(metrics[name])


def test_setr_two_iterations_on_the_gpu(tmp_path):
    pytest.importorskip('mmcv.ops', reason='mmseg needs mmcv with its compiled ops')
    from tests import test_downstream as downstream
    from tests.helpers import scalars

    checkpoint = tmp_path / 'epoch_100.pth'
    downstream.save_mst_checkpoint('configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py',
                                   checkpoint)
    cfg, small_config = downstream.small_setr_cfg(tmp_path)
    downstream.converter.main([str(checkpoint), str(tmp_path / 'deit.pth'), '--target', 'mmseg',
                               '--config', small_config])
    cfg.model.backbone.init_cfg.checkpoint = str(tmp_path / 'deit.pth')
    tested = train_two_downstream_iterations_on_the_gpu(cfg, tmp_path, 'iter_2.pth')
    metrics = next(line for line in scalars(tmp_path / 'work') if 'mIoU' in line)
    assert tested['mIoU'] == pytest.approx(metrics['mIoU'])
