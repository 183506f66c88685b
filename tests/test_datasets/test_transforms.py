"""MultiCrop: DINO's views from mmpretrain's transforms, random per view and sample."""
import math
import random

import mmcv
import numpy as np
import pytest
from mmpretrain.datasets.transforms import ColorJitter
from PIL import Image

import mst_mm  # noqa: F401
from mst_mm.datasets import FusedColorJitter, MultiCrop
from mst_mm.datasets.transforms import _shift_hue


def _image(seed=0):
    return np.random.RandomState(seed).randint(0, 256, (120, 150, 3), dtype=np.uint8)


def test_views_sizes_and_count():
    views = MultiCrop(global_size=64, local_size=24, num_local_crops=3)(dict(img=_image()))['img']
    assert [v.shape for v in views] == [(64, 64, 3)] * 2 + [(24, 24, 3)] * 3
    only_globals = MultiCrop(global_size=64, local_size=24, num_local_crops=0)
    assert len(only_globals(dict(img=_image()))['img']) == 2


def test_asymmetric_blur_and_solarize_with_per_call_radius():
    transform = MultiCrop(num_local_crops=2)
    g1, g2, local = (view.transforms for view in transform.multi_view.pipelines)
    blur = {name: [t for t in pipe if type(t).__name__ == 'GaussianBlur'][0]
            for name, pipe in (('g1', g1), ('g2', g2), ('local', local))}
    assert (blur['g1'].prob, blur['g2'].prob, blur['local'].prob) == (1.0, 0.1, 0.5)
    # magnitude_std='inf' draws the radius uniformly at every call, not once at build time.
    radii = {round(blur['g1'].random_magnitude(), 6) for _ in range(20)}
    assert len(radii) > 10 and all(0.1 <= r <= 2.0 for r in radii)
    assert any(type(t).__name__ == 'Solarize' for t in g2)
    assert not any(type(t).__name__ == 'Solarize' for t in g1)


def test_two_samples_get_different_views_and_bad_sizes_are_refused():
    transform = MultiCrop(global_size=32, local_size=16, num_local_crops=1)
    image = _image()
    a = transform(dict(img=image.copy()))['img']
    b = transform(dict(img=image.copy()))['img']
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match='Local crops'):
        MultiCrop(global_size=32, local_size=64)


def _seeded(transform, image, seed):
    random.seed(seed)           # GaussianBlur draws from `random`, the rest from numpy
    np.random.seed(seed)
    return transform(dict(img=image.copy()))['img']


@pytest.mark.parametrize('shape', [(120, 150, 3), (97, 61, 3)])
def test_fast_transforms_give_mmpretrains_images_bit_for_bit(shape):
    image = np.random.RandomState(1).randint(0, 256, shape, dtype=np.uint8)
    jitter = dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
    fast, reference = FusedColorJitter(**jitter), ColorJitter(**jitter)
    for seed in range(6):
        out = _seeded(fast, image, seed)
        assert np.array_equal(out, _seeded(reference, image, seed)), seed
    assert not np.array_equal(_seeded(fast, image, 0), _seeded(fast, image, 1))

    fast = MultiCrop(global_size=40, local_size=16, num_local_crops=3)
    reference = MultiCrop(global_size=40, local_size=16, num_local_crops=3,
                          fast_transforms=False)
    jitters = [type(t.transforms.transforms[0]).__name__
               for t in fast.multi_view.pipelines[0].transforms
               if type(t).__name__ == 'RandomApply']
    assert jitters == ['FusedColorJitter']
    for seed in range(4):
        views = _seeded(fast, image, seed)
        assert len(views) == 5
        assert all(np.array_equal(a, b) for a, b in zip(views, _seeded(reference, image, seed)))


def test_views_of_a_grey_image_stay_grey():
    # The decoder's targets are these views: on grey data (the demo's) every one must have
    # R = G = B, so a tinted reconstruction is the decoder's error, not the augmentation's.
    grey = np.repeat(_image()[..., :1], 3, axis=2)
    transform = MultiCrop(global_size=40, local_size=16, num_local_crops=2)
    for seed in range(20):   # jitter, grayscale, blur and solarize all drawn on and off
        for view in _seeded(transform, grey, seed):
            assert (view == view[..., :1]).all(), seed
    coloured = _seeded(transform, _image(), 0)
    assert not all((view == view[..., :1]).all() for view in coloured)


# Hue factors around zero, where truncation and flooring differ, and at both ends of mmcv's
# range; numpy floats as well, which is what mmpretrain's ColorJitter draws.
HUE_FACTORS = [-0.5, -0.1, -0.0999, -0.05, -0.004, -0.001, 0.0, 0.001, 0.004, 0.05, 0.1, 0.5,
               np.float64(-0.04036496088373729), np.float64(0.0731)]


def _coloured_rgb():
    return np.random.RandomState(2).randint(0, 256, (32, 48, 3), dtype=np.uint8)


def _reference_hue_shift(rgb, hue_factor):
    """PIL's HSV hue plus trunc(255 hue_factor), modulo 256: numpy 1's np.uint8 in mmcv."""
    h, s, v = Image.fromarray(rgb).convert('HSV').split()
    step = math.trunc(hue_factor * 255)
    h.putdata([(value + step) % 256 for value in h.getdata()])
    return np.array(Image.merge('HSV', (h, s, v)).convert('RGB'))


@pytest.mark.parametrize('hue_factor', HUE_FACTORS)
def test_shift_hue_truncates_and_wraps_like_numpy_1(hue_factor):
    rgb = _coloured_rgb()
    shifted = np.array(_shift_hue(Image.fromarray(rgb), hue_factor))
    assert np.array_equal(shifted, _reference_hue_shift(rgb, hue_factor))
    # Not a no-op: only a zero step gives PIL's plain HSV round trip.
    unshifted = _reference_hue_shift(rgb, 0.0)
    assert np.array_equal(shifted, unshifted) == (math.trunc(hue_factor * 255) == 0)


@pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) >= '2.0.0',
                    reason="mmcv's adjust_hue raises OverflowError for hue < 0 under numpy 2")
@pytest.mark.parametrize('hue_factor', HUE_FACTORS)
def test_shift_hue_equals_mmcv_adjust_hue_under_numpy_1(hue_factor):
    rgb = _coloured_rgb()
    expected = mmcv.adjust_hue(np.ascontiguousarray(rgb[..., ::-1]), hue_factor,
                               backend='pillow')[..., ::-1]
    assert np.array_equal(np.array(_shift_hue(Image.fromarray(rgb), hue_factor)), expected)


def test_under_numpy_2_mmpretrains_colour_jitter_is_refused_up_front(monkeypatch):
    """The one path that needs numpy < 2 says so when the pipeline is built, not with
    mmcv's OverflowError at the first negative hue."""
    monkeypatch.setattr(np, '__version__', '2.1.0')
    with pytest.raises(ValueError, match=r"numpy 2 \(numpy 2.1.0 is installed\).*"
                                         r"fast_transforms=True.*numpy<2"):
        MultiCrop(global_size=32, local_size=16, num_local_crops=2, fast_transforms=False)
    MultiCrop(global_size=32, local_size=16, num_local_crops=2)  # the default is fine


def test_under_numpy_2_the_jitters_fallback_names_the_fix(monkeypatch):
    def overflow(self, results):
        raise OverflowError('Python integer -16 out of bounds for uint8')

    monkeypatch.setattr(ColorJitter, 'transform', overflow)
    jitter = FusedColorJitter(hue=0.1, backend='cv2')
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    monkeypatch.setattr(np, '__version__', '1.26.4')
    with pytest.raises(OverflowError):  # numpy 1: not ours to explain
        jitter.transform(dict(img=image))
    monkeypatch.setattr(np, '__version__', '2.1.0')
    with pytest.raises(RuntimeError, match=r"numpy 2.1.0 is installed.*backend 'cv2'.*"
                                           r"pillow backend.*numpy<2"):
        jitter.transform(dict(img=image))
