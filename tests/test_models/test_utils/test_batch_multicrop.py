"""BatchMultiCrop: MultiCrop's augmentations for a whole batch, checked against the per-image
operations they stand for (PIL's resampling, mmcv's pillow colour operations) and against
mmpretrain's crop rule."""
import math

import mmcv
import numpy as np
import pytest
import torch
from PIL import Image

from mst_mm.models.utils.batch_multicrop import (
    BatchMultiCrop,
    MultiCropDataPreprocessor,
    crop_boxes,
)
from mst_mm.models.utils.view_ops import (
    _blend,
    _rotate_hue,
    blur_weights,
    colour_jitter,
    resize_weights,
)


def _images(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """Smooth colour images (uint8 BGR, n x size x size x 3): blobs, not noise, like photos."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (n, size // 4, size // 4, 3)).astype(np.float32)
    return np.stack([mmcv.imresize(c, (size, size), interpolation='bilinear')
                     for c in coarse]).round().clip(0, 255).astype(np.uint8)


def _as_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float()


def test_crop_and_resize_equals_pil_bicubic_on_the_cropped_image():
    images = _images(6)
    top, left = torch.tensor([0, 3, 5, 0, 10, 1]), torch.tensor([0, 7, 2, 12, 0, 4])
    height, width = torch.tensor([32, 20, 14, 11, 22, 31]), torch.tensor([32, 17, 25, 20, 9, 28])
    for out in (32, 16):   # enlarging and shrinking (the antialiased kernel)
        rows = resize_weights(top, height, 32, out)
        cols = resize_weights(left, width, 32, out)
        ours = (rows[:, None] @ _as_tensor(images) @ cols[:, None].transpose(-1, -2))
        ours = ours.round().clamp(0, 255).permute(0, 2, 3, 1).numpy()
        for i, image in enumerate(images):
            crop = image[top[i]:top[i] + height[i], left[i]:left[i] + width[i]]
            pil = np.asarray(Image.fromarray(crop).resize((out, out), Image.BICUBIC))
            # PIL works in fixed point and clips between its two passes: at most a level
            # or two apart, on average far less.
            diff = np.abs(ours[i] - pil.astype(np.float32))
            assert diff.max() <= 3 and diff.mean() < 0.3, (i, out, diff.max(), diff.mean())


def test_blur_is_a_gaussian_convolution_with_extended_edges():
    gen = torch.Generator().manual_seed(0)
    sigma = torch.tensor([0.0, 0.3, 0.8, 2.0])
    image = torch.rand(4, 12, generator=gen)
    ours = (blur_weights(sigma, 12, max_sigma=2.0) @ image[..., None])[..., 0]
    for i, s in enumerate(sigma.tolist()):
        if s == 0:
            torch.testing.assert_close(ours[i], image[i])
            continue
        reach = math.ceil(3 * 2.0)
        taps = np.exp(-0.5 * (np.arange(-reach, reach + 1) / s)**2)
        padded = np.pad(image[i].numpy(), reach, mode='edge')
        expected = np.convolve(padded, taps / taps.sum(), mode='valid')
        np.testing.assert_allclose(ours[i].numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('op,mmcv_op', [(0, 'adjust_brightness'), (1, 'adjust_contrast'),
                                        (2, 'adjust_color')])
@pytest.mark.parametrize('kind', ['smooth', 'noise'])
def test_each_blend_equals_mmcvs_pillow_one_bit_for_bit(op, mmcv_op, kind):
    """Brightness, contrast and saturation with PIL's arithmetic: its rounded grey image,
    its contrast anchor int(mean + 0.5) and its float blend truncated to uint8."""
    images = _images(8, seed=op) if kind == 'smooth' else np.random.default_rng(op).integers(
        0, 256, (8, 24, 24, 3), dtype=np.uint8)
    factors = torch.tensor([0.6, 0.8, 1.2, 1.4, 0.7, 1.0, 1.3, 0.9]).add(0.0123)
    ours = _blend(_as_tensor(images), torch.full((8, ), op), factors).permute(0, 2, 3, 1)
    for i, (image, factor) in enumerate(zip(images, factors.tolist())):
        expected = getattr(mmcv, mmcv_op)(image, factor, backend='pillow')
        np.testing.assert_array_equal(ours[i].numpy(), expected.astype(np.float32),
                                      err_msg=f'{mmcv_op}, image {i}, factor {factor}')


def test_hue_rotation_is_mmcvs_pillow_one_up_to_pils_hsv_quantisation():
    images = _images(8, seed=3)
    factors = [-0.1, -0.05, 0.02, 0.1, 0.07, -0.08, 0.0, 0.04]
    ours = _rotate_hue(_as_tensor(images), torch.tensor(factors)).round().clamp(0, 255)
    ours = ours.permute(0, 2, 3, 1).numpy()
    for i, (image, factor) in enumerate(zip(images, factors)):
        expected = mmcv.adjust_hue(image, factor, backend='pillow')
        diff = np.abs(ours[i] - expected.astype(np.float32))
        # PIL's HSV round trip quantises H, S and V to 8 bits (mmcv shifts H by whole 1/256
        # steps, as ours does): up to 8 levels where a colour is saturated, under half a
        # level on average.
        assert diff.max() <= 8 and diff.mean() < 0.5, (i, factor, diff.max(), diff.mean())


def test_no_op_leaves_the_images_unchanged():
    images = _as_tensor(_images(3))
    out = _blend(images.clone(), torch.full((3, ), -1), torch.tensor([1.4, 0.6, 0.1]))
    assert torch.equal(out, images)
    order, factors = torch.arange(4).repeat(3, 1), torch.tensor([[1.4, 0.6, 1.2, 0.1]] * 3)
    unjittered = torch.zeros(3, dtype=torch.bool)
    assert torch.equal(colour_jitter(images.clone(), unjittered, order, factors), images)


def test_jitter_applies_each_images_operations_in_its_own_order():
    gen = torch.Generator().manual_seed(0)
    images = _as_tensor(_images(24, seed=5))
    jittered = torch.rand(24, generator=gen) < 0.8
    order = torch.rand(24, 4, generator=gen).argsort(1)
    factors = torch.stack([torch.empty(24).uniform_(0.6, 1.4, generator=gen),
                           torch.empty(24).uniform_(0.6, 1.4, generator=gen),
                           torch.empty(24).uniform_(0.8, 1.2, generator=gen),
                           torch.empty(24).uniform_(-0.1, 0.1, generator=gen)], 1)
    ours = colour_jitter(images.clone(), jittered, order, factors)
    for i in range(24):     # one image at a time, one operation at a time, in its order
        x = images[i:i + 1].clone()
        for op in (order[i].tolist() if jittered[i] else []):
            x = (_blend(x, torch.tensor([op]), factors[i, op:op + 1]) if op < 3 else
                 _rotate_hue(x, factors[i, 3:]).round().clamp(0, 255))
        assert torch.equal(ours[i:i + 1], x), i


def test_crop_boxes_follow_mmpretrains_rule():
    torch.manual_seed(0)
    top, left, height, width = crop_boxes(4000, 32, 24, (0.2, 0.5))
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + height <= 32).all() and (left + width <= 24).all()
    area = (height * width).double() / (32 * 24)
    # Rounding the sides to whole pixels moves the area a little past the drawn range.
    assert area.min() > 0.15 and area.max() < 0.56
    ratio = width.double() / height.double()
    assert ratio.min() > 3 / 4 * 0.85 and ratio.max() < 4 / 3 * 1.15
    # The offset is uniform over every position that keeps the crop inside: both ends occur.
    same = height == 13
    assert same.sum() > 50 and top[same].min() == 0 and top[same].max() == 32 - 13
    # A range no crop can satisfy falls back to the centred whole image (ratio 1 here).
    top, left, height, width = crop_boxes(5, 16, 16, (2.0, 3.0))
    assert (height == 16).all() and (width == 16).all() and (top == 0).all()


def test_views_have_multicrops_shapes_order_and_values():
    transform = BatchMultiCrop(global_size=32, local_size=16, num_local_crops=3,
                               global_scale=(0.5, 1.0), local_scale=(0.2, 0.5),
                               blur_radius=(0.1, 0.5))
    images = _as_tensor(_images(500))
    torch.manual_seed(0)
    views = transform(images)
    assert [tuple(v.shape) for v in views] == [(500, 3, 32, 32)] * 2 + [(500, 3, 16, 16)] * 3
    for view in views:
        assert view.min() >= 0 and view.max() <= 255 and torch.equal(view, view.round())
    # Views are drawn independently: no two views of an image are the same.
    assert all(not torch.equal(views[0][i], views[1][i]) for i in range(20))
    # The same seed gives the same views.
    torch.manual_seed(0)
    assert all(torch.equal(a, b) for a, b in zip(views, transform(images)))
    # Grayscale with probability 0.2: equal channels, which the colour images never have.
    gray = torch.cat([(v[:, 0] == v[:, 1]).flatten(1).all(1) for v in views]).float()
    assert 0.16 < gray.mean() < 0.24


def test_the_preprocessor_crops_only_in_training_and_refuses_mixed_sizes():
    pre = MultiCropDataPreprocessor(
        multi_crop=dict(type='BatchMultiCrop', global_size=16, local_size=8,
                        num_local_crops=2),
        mean=[127.5] * 3, std=[64.0] * 3, to_rgb=True)
    images = torch.from_numpy(_images(4, size=16)).permute(0, 3, 1, 2).contiguous()
    out = pre(dict(inputs=images, data_samples=None), training=True)
    assert [tuple(v.shape) for v in out['inputs']] == [(4, 3, 16, 16)] * 2 + [(4, 3, 8, 8)] * 2
    assert all(v.min() >= -127.5 / 64 and v.max() <= 127.5 / 64 for v in out['inputs'])
    # Outside training the images are only normalised (RGB order), as mmpretrain does.
    plain = pre(dict(inputs=images, data_samples=None), training=False)['inputs']
    torch.testing.assert_close(plain, (images[:, [2, 1, 0]].float() - 127.5) / 64)
    with pytest.raises(ValueError, match='differ in size'):
        pre(dict(inputs=[images[0], images[1, :, :8]], data_samples=None), training=True)


def _pil_grey(bgr: np.ndarray) -> np.ndarray:
    """DINO's grey view: torchvision's RandomGrayscale is PIL's convert('L'), in 3 channels."""
    grey = np.array(Image.fromarray(np.ascontiguousarray(bgr[..., ::-1])).convert('L'))
    return np.repeat(grey[..., None], 3, axis=-1)


def test_flip_grey_and_solarise_match_the_per_image_operations():
    from mst_mm.models.utils.view_ops import flip, grayscale, solarize
    images = np.concatenate([_images(4), np.random.default_rng(0).integers(
        0, 256, (4, 32, 32, 3), dtype=np.uint8)])
    chosen = torch.tensor([True, False, True, False] * 2)
    per_image = {
        flip: lambda img: mmcv.imflip(img, 'horizontal'),
        grayscale: _pil_grey,
        solarize: lambda img: mmcv.solarize(img, thr=128),
    }
    for batched, reference in per_image.items():
        ours = batched(_as_tensor(images), chosen).permute(0, 2, 3, 1).numpy()
        for i, image in enumerate(images):
            expected = reference(image) if chosen[i] else image
            np.testing.assert_array_equal(ours[i], expected.astype(np.float32),
                                          err_msg=f'{batched.__name__}, image {i}')


def _worker_views(n: int, seed: int = 0) -> list:
    """What the data workers hand over with MultiCrop(crops_only=True): uint8 views, per view
    a (n, 3, h, w) batch, global views first."""
    from mst_mm.datasets import MultiCrop
    np.random.seed(seed)
    crops = MultiCrop(global_size=32, local_size=16, num_local_crops=3, crops_only=True)
    images = _images(n, size=48, seed=seed)
    per_image = [crops(dict(img=image))['img'] for image in images]
    return [torch.from_numpy(np.stack(views)).permute(0, 3, 1, 2).contiguous()
            for views in zip(*per_image)]


def test_view_augment_keeps_the_views_order_and_draws_per_view(monkeypatch):
    from mst_mm.models.utils.batch_multicrop import BatchViewAugment
    views = _worker_views(200)
    assert [v.dtype for v in views] == [torch.uint8] * 5
    augment = BatchViewAugment(blur_radius=(0.1, 0.5))
    torch.manual_seed(0)
    out = augment(views)
    assert [tuple(v.shape) for v in out] == [(200, 3, 32, 32)] * 2 + [(200, 3, 16, 16)] * 3
    for view in out:
        assert view.min() >= 0 and view.max() <= 255 and torch.equal(view, view.round())
    torch.manual_seed(0)
    assert all(torch.equal(a, b) for a, b in zip(out, augment(views)))
    # Two views cut alike still come out differently: each view draws its own parameters.
    same_input = [views[0], views[0].clone()]
    first, second = augment(same_input)
    assert (first != second).flatten(1).any(1).float().mean() > 0.9
    gray = torch.cat([(v[:, 0] == v[:, 1]).flatten(1).all(1) for v in out]).float()
    assert 0.15 < gray.mean() < 0.25
    # MultiCrop's probabilities per view: blur 1.0, 0.1 (globals), 0.5 (locals); solarise
    # 0.2 on the second global view only.
    seen = []
    monkeypatch.setattr(BatchViewAugment, '_augment',
                        lambda self, x, blur, solarize, may: seen.append((blur, solarize)) or x)
    augment(views)
    (global_blur, global_solarize), (local_blur, local_solarize) = seen
    expected = torch.tensor([1.0] * 200 + [0.1] * 200)
    assert torch.equal(global_blur, expected)
    assert torch.equal(global_solarize, torch.tensor([0.0] * 200 + [0.2] * 200))
    assert torch.equal(local_blur, torch.full((600, ), 0.5))
    assert not local_solarize.any()


def test_the_preprocessor_augments_worker_views_and_refuses_whole_images():
    pre = MultiCropDataPreprocessor(
        multi_crop=dict(type='BatchViewAugment'), mean=[127.5] * 3, std=[64.0] * 3,
        to_rgb=True, non_blocking=True)
    views = _worker_views(4)
    out = pre(dict(inputs=views, data_samples=None), training=True)['inputs']
    assert [tuple(v.shape) for v in out] == [(4, 3, 32, 32)] * 2 + [(4, 3, 16, 16)] * 3
    assert all(v.dtype == torch.float32 and v.abs().max() <= 127.5 / 64 for v in out)
    with pytest.raises(ValueError, match=r'MultiCrop\(crops_only=True\)'):
        pre(dict(inputs=views[0], data_samples=None), training=True)


def test_crops_only_gives_the_crops_of_the_full_pipeline_bit_for_bit():
    from mmpretrain.datasets.transforms import RandomResizedCrop

    from mst_mm.datasets import MultiCrop
    image = np.random.RandomState(3).randint(0, 256, (75, 100, 3), dtype=np.uint8)
    crops = MultiCrop(global_size=32, local_size=16, num_local_crops=2, crops_only=True)
    sizes_and_scales = [(32, (0.4, 1.0))] * 2 + [(16, (0.05, 0.4))] * 2
    for seed in range(3):
        np.random.seed(seed)
        ours = crops(dict(img=image.copy()))['img']
        np.random.seed(seed)
        expected = [RandomResizedCrop(scale=size, crop_ratio_range=scale,
                                      interpolation='bicubic', backend='pillow')(
                        dict(img=image.copy()))['img'] for size, scale in sizes_and_scales]
        assert all(np.array_equal(a, b) for a, b in zip(ours, expected)), seed
