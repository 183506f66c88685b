"""The demo's data: real textures, grey and rank-equalised, on which raw pixels stay weak."""
import numpy as np
import torch

from mst_mm.datasets import stratified_split, texture_patches, write_demo_dataset
from mst_mm.datasets.demo_textures import rank_equalise
from mst_mm.evaluation import knn_top1


def test_rank_equalise_keeps_order_and_ties_and_flattens_the_histogram():
    gray = np.array([[10, 10, 200], [50, 7, 255]], dtype=np.uint8)
    out = rank_equalise(gray)
    # Ranks 0..5 with the two 10s sharing rank 1.5, scaled by 255 / 5.
    expected = np.round(np.array([[1.5, 1.5, 4], [3, 0, 5]]) * 51).astype(np.uint8)
    np.testing.assert_array_equal(out, expected)
    # A brighter, higher-contrast copy of a patch has the same equalised image.
    patch = np.random.RandomState(0).randint(0, 120, (8, 8)).astype(np.uint8)
    np.testing.assert_array_equal(rank_equalise(patch), rank_equalise(patch * 2 + 10))


def test_patches_share_one_histogram_and_raw_pixels_stay_below_90_percent():
    images, labels = texture_patches(patch=32, per_class=256)
    assert images.shape == (6 * 256, 32, 32) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [256] * 6
    # Brightness and contrast carry no class: every patch's mean is mid-grey.
    assert np.allclose(images.reshape(len(images), -1).mean(1), 127.5, atol=1.0)
    train, held_out = stratified_split(labels, 0.25)
    assert not set(train) & set(held_out) and len(held_out) == 6 * 64
    feats = torch.tensor(images.reshape(len(images), -1), dtype=torch.float32)
    labels_t = torch.tensor(labels)
    top1 = knn_top1(feats[train], labels_t[train], feats[held_out], labels_t[held_out],
                    ks=(20,))
    assert top1[20] < 90


def test_write_demo_dataset_writes_once_and_rewrites_an_older_version(tmp_path):
    summary = write_demo_dataset(str(tmp_path), per_class=8)
    assert (summary['train'], summary['val']) == (36, 12)
    files = sorted(tmp_path.glob('*/*/*.png'))
    assert len(files) == 48
    stamp = tmp_path / 'dataset.json'
    stamp.write_text(stamp.read_text().replace('"version": 2', '"version": 1'))
    (tmp_path / 'train' / 'brick' / 'stale.png').write_bytes(b'')
    write_demo_dataset(str(tmp_path), per_class=8)
    assert sorted(tmp_path.glob('*/*/*.png')) == files  # the stale file is gone
