"""The bundled-photo folder of projects/mst_research/tools/write_bundled_photos.py."""
import os

import numpy as np
from PIL import Image

from mst_research.data import PHOTOS, write_photo_crops


def test_writes_square_rgb_crops_once(tmp_path):
    out = tmp_path / 'photos'
    summary = write_photo_crops(str(out), num_images=len(PHOTOS) + 2, size=48, seed=1)
    files = sorted(p for p in out.iterdir() if p.suffix == '.jpg')
    assert len(files) == len(PHOTOS) + 2 == summary['num_images']
    for path in files:
        with Image.open(path) as img:
            assert img.size == (48, 48) and img.mode == 'RGB'
    # Crops of different photos differ (round-robin over the sources).
    first, second = (np.asarray(Image.open(files[i]), dtype=np.float32) for i in (0, 1))
    assert np.abs(first - second).mean() > 5
    # Same arguments: the folder is kept as it is.
    stamp = os.path.getmtime(files[0])
    assert write_photo_crops(str(out), num_images=len(PHOTOS) + 2, size=48, seed=1) == summary
    assert os.path.getmtime(files[0]) == stamp


def test_seed_changes_the_crops(tmp_path):
    write_photo_crops(str(tmp_path / 'a'), num_images=1, size=32, seed=0)
    write_photo_crops(str(tmp_path / 'b'), num_images=1, size=32, seed=1)
    a, b = (np.asarray(Image.open(tmp_path / d / '00000.jpg'), dtype=np.float32) for d in 'ab')
    assert np.abs(a - b).mean() > 1


def test_imagenet_sized_crops_keep_the_photos_aspect(tmp_path):
    summary = write_photo_crops(str(tmp_path), num_images=3, size=500, height=375)
    assert summary['height'] == 375
    for i in range(3):
        with Image.open(tmp_path / f'{i:05d}.jpg') as img:
            assert img.size == (500, 375)
