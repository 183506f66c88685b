"""The evidence data: the fixed split, the object images and the scene annotations."""
import json

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from mst_research.data import (
    CLASSES,
    load_object_masks,
    load_silhouettes,
    render_object_image,
    stratified_split,
    tight_box,
    write_object_images,
    write_scenes,
)


def test_the_installed_package_has_1000_silhouettes_of_each_class():
    images, labels = load_silhouettes()
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [1000] * 10


def test_split_is_fixed_stratified_and_disjoint():
    _, labels = load_silhouettes()
    train, test = stratified_split(labels)
    assert len(train) == 8000 and len(test) == 2000
    assert np.bincount(labels[test]).tolist() == [200] * 10
    assert not set(train) & set(test)
    again_train, again_test = stratified_split(labels)
    assert np.array_equal(train, again_train) and np.array_equal(test, again_test)
    assert not np.array_equal(test, stratified_split(labels, seed=1)[1])
    with pytest.raises(ValueError, match='cannot hold out'):
        stratified_split(labels, test_per_class=1000)


def test_object_image_has_its_mask_and_no_per_image_level():
    images, _ = load_silhouettes()
    levels = []
    for index in range(0, 10000, 500):
        image, mask = render_object_image(images[index], np.random.RandomState(index), 32)
        assert image.shape == (32, 32, 3) and mask.shape == (32, 32)
        assert (image[..., 0] == image[..., 2]).all()        # grey: no colour cue
        assert 0.08 < mask.mean() < 0.55                     # roughly 15-50 % of the canvas
        grey = image[..., 0].astype(float)
        assert grey[mask].mean() > grey[~mask].mean() + 60   # the object stands out
        levels.append((grey[mask].mean(), grey[~mask].mean()))
    # Every image has the same object and background levels (within a few grey steps), so
    # neither identifies an image.
    assert np.ptp([lv[0] for lv in levels]) < 12 and np.ptp([lv[1] for lv in levels]) < 25


def test_object_images_written_in_class_folders_with_masks(tmp_path, small_package):
    summary = write_object_images(str(tmp_path), test_per_class=1, package_dir=small_package)
    assert summary['train'] == 30 and summary['test'] == 10
    for split in ('train', 'test'):
        masks = load_object_masks(str(tmp_path), split)
        assert len(masks) == summary[split]
        for rel, mask in masks.items():
            split_dir, cls, _ = rel.split('/')
            assert split_dir == split and cls in CLASSES
            image = np.array(Image.open(tmp_path / rel))
            grey = image[..., 0].astype(float)
            assert grey[mask].mean() > grey[~mask].mean() + 60
    stamp = (tmp_path / 'dataset.json').stat().st_mtime_ns
    write_object_images(str(tmp_path), test_per_class=1, package_dir=small_package)
    assert (tmp_path / 'dataset.json').stat().st_mtime_ns == stamp   # kept, not rewritten


def test_scene_annotations_match_the_rendered_pixels(tmp_path, small_package):
    summary = write_scenes(str(tmp_path), train_scenes=12, val_scenes=6, test_per_class=1,
                           package_dir=small_package)
    images, labels = load_silhouettes(small_package)
    train_pool, test_pool = stratified_split(labels, 1)
    for split, pool in (('train', train_pool), ('val', test_pool)):
        coco = json.loads((tmp_path / 'annotations' / f'instances_{split}.json').read_text())
        assert [c['name'] for c in coco['categories']] == list(CLASSES)
        assert summary[split]['objects'] == len(coco['annotations']) > 0
        by_image = {}
        for ann in coco['annotations']:
            by_image.setdefault(ann['image_id'], []).append(ann)
            assert ann['silhouette_index'] in pool        # no silhouette crosses the split
            assert ann['category_id'] == labels[ann['silhouette_index']] + 1
        for info in coco['images']:
            label_map = np.array(Image.open(tmp_path / 'labels' / split / info['file_name']))
            image = np.array(Image.open(tmp_path / split / info['file_name']))[..., 0]
            covered = np.zeros(label_map.shape, dtype=int)
            for ann in by_image.get(info['id'], []):
                rle = dict(ann['segmentation'], counts=ann['segmentation']['counts'].encode())
                mask = mask_utils.decode(rle).astype(bool)
                assert ann['area'] == mask.sum() > 0
                assert ann['bbox'] == tight_box(mask)
                x, y, w, h = map(int, ann['bbox'])     # tight: every edge touches the mask
                assert mask[y, x:x + w].any() and mask[y + h - 1, x:x + w].any()
                assert mask[y:y + h, x].any() and mask[y:y + h, x + w - 1].any()
                assert (label_map[mask] == ann['category_id']).all()
                covered += mask
            assert covered.max() <= 1                  # instances do not share pixels
            assert ((label_map > 0) == (covered == 1)).all()
            # every painted (bright) pixel is annotated: no unlabelled animal
            assert (image[label_map == 0] < 200).mean() > 0.95
