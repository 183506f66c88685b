"""The verified stack imports and works in one process.

Each check guards one known trap of the pinned stack (numpy 2, setuptools 82, the +cpu torch
build, weights-only loading, ...); a failure here names the trap so that a broken install
is diagnosed before any algorithm test runs.
"""
import importlib.metadata as metadata

import numpy as np
import pytest
import torch


def test_numpy_below_2_and_colour_jitter_with_negative_hue():
    # Trap 3: numpy 2 makes mmcv.adjust_hue raise OverflowError for hue < 0.
    assert int(np.__version__.split('.')[0]) < 2, 'numpy >= 2 breaks mmcv colour jitter'
    from mmpretrain.datasets.transforms import ColorJitter

    img = np.random.RandomState(0).randint(0, 256, (32, 32, 3), dtype=np.uint8)
    transform = ColorJitter(brightness=0., contrast=0., saturation=0., hue=(-0.4, -0.4))
    out = transform(dict(img=img.copy()))['img']
    assert out.shape == img.shape and out.dtype == np.uint8
    assert not np.array_equal(out, img), 'a hue shift of -0.4 must change a random image'


@pytest.mark.parametrize('base, model_type', [
    ('mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', 'MaskRCNN'),
    ('mmseg::_base_/models/setr_pup.py', 'EncoderDecoder'),
])
def test_setuptools_keeps_pkg_resources_for_cross_package_configs(tmp_path, base, model_type):
    # Trap 6: setuptools >= 82 has no pkg_resources; `mmdet::` bases need it.
    major = int(metadata.version('setuptools').split('.')[0])
    assert 77 <= major < 82
    from mmengine.config import Config

    providers = mmseg_providers()
    if base.startswith('mmseg::') and providers and 'mmsegmentation' not in providers:
        # OneDL: mmengine looks the prefix up by the distribution name (docs/install.md).
        pytest.skip('mmengine resolves mmseg:: by the distribution name mmsegmentation, and '
                    f'mmseg here comes from {", ".join(providers)}')
    config = tmp_path / 'cross_package.py'
    config.write_text(f'_base_ = [{base!r}]\n')
    assert Config.fromfile(str(config)).model.type == model_type


def mmseg_providers() -> list:
    return metadata.packages_distributions().get('mmseg', [])


def test_torch_is_the_registry_build_and_torchvision_ops_work():
    # Trap 1: the local `+cpu` torch makes torchvision fail to import its ops.
    assert not torch.__version__.endswith('+cpu'), torch.__version__
    import torchvision

    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    assert keep.tolist() == [0, 2]


def test_mmcv_ops_run_on_cpu():
    # Trap 2: mmcv must be built with its compiled ops (Mask R-CNN needs them).
    from mmcv.ops import RoIAlign, nms

    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    assert torch.allclose(dets[:, 4], torch.tensor([0.9, 0.7]))

    # A constant feature map pools to the same constant in every bin.
    feats = torch.full((1, 2, 16, 16), 3.0)
    rois = torch.tensor([[0., 2., 2., 10., 10.]])
    pooled = RoIAlign(output_size=(4, 4), spatial_scale=1.0, sampling_ratio=2)(feats, rois)
    assert pooled.shape == (1, 2, 4, 4)
    assert torch.allclose(pooled, torch.full_like(pooled, 3.0))


def test_frameworks_and_plugin_import_together():
    # Trap 5: mmselfsup next to mmpretrain + mmdet breaks registries; we must not need it.
    import mmdet.models  # noqa: F401
    import mmpretrain.models  # noqa: F401
    import mmseg.models  # noqa: F401  (needs ftfy and regex)

    import mst_mm

    assert mst_mm.__version__
    with pytest.raises(ImportError):
        import mmselfsup  # noqa: F401


def test_build_deit_small_and_swin_tiny():
    from mmpretrain.registry import MODELS

    deit = MODELS.build(dict(type='VisionTransformer', arch='deit-small', img_size=224))
    swin = MODELS.build(dict(type='SwinTransformer', arch='tiny', img_size=224))
    n_deit = sum(p.numel() for p in deit.parameters())
    n_swin = sum(p.numel() for p in swin.parameters())
    assert 21.5e6 < n_deit < 22.0e6, n_deit   # DeiT-S: 21.7 M without a head
    assert 27.0e6 < n_swin < 28.5e6, n_swin   # Swin-T: 27.5 M without a head
    with torch.no_grad():
        cls = deit(torch.randn(1, 3, 224, 224))[-1]
        feat = swin(torch.randn(1, 3, 224, 224))[-1]
    assert cls.shape == (1, 384)
    assert feat.shape == (1, 768, 7, 7)
