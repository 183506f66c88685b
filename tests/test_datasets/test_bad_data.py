"""Broken data: missing roots and files fail at start-up, broken images are skipped within
a budget, and unusual image modes train like any other."""
import io
import os.path as osp

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.dataset import default_collate
from mmpretrain.registry import DATASETS
from PIL import Image

import mst_mm  # noqa: F401
from tests.helpers import DEMO_CONFIG, make_image_folder, mmlogger_records

PIPELINE = [dict(type='LoadImageOrSkip'), dict(type='PackInputs')]


def build(**kwargs):
    return DATASETS.build(dict(type='CheckedImageDataset', pipeline=PIPELINE, **kwargs))


def test_missing_or_empty_roots_and_missing_listed_images_fail_at_start_up(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"data_root '{tmp_path / 'nowhere'}'"):
        build(data_root=str(tmp_path / 'nowhere'))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(RuntimeError, match='No images in .*empty'):
        build(data_root=str(tmp_path / 'empty'))
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=2)
    ann = tmp_path / 'ann.txt'
    ann.write_text('class_0/0.png 0\nclass_0/gone.png 0\nclass_0/lost.png 0\n')
    with pytest.raises(FileNotFoundError, match=r"2 of the 3 images .*gone\.png"):
        build(data_root=root, ann_file=str(ann), with_label=True)
    assert len(build(data_root=root, ann_file=str(ann), with_label=True,
                     check_files=False)) == 3


def _encoded(fmt: str, size=(20, 24)) -> bytes:
    buffer = io.BytesIO()
    rgb = np.random.RandomState(1).randint(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(buffer, format=fmt)
    return buffer.getvalue()


BROKEN = ('truncated.jpg', 'garbage.png', 'empty.png', 'notes.jpg')


@pytest.mark.slow
def test_broken_images_are_skipped_with_a_warning_then_stop_past_the_budget(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=3)
    folder = tmp_path / 'data' / 'class_0'
    good = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(good, format='JPEG')
    (folder / 'truncated.jpg').write_bytes(good.getvalue()[:len(good.getvalue()) // 2])
    (folder / 'garbage.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'not an image' * 10)
    (folder / 'empty.png').write_bytes(b'')
    (folder / 'notes.jpg').write_text('not a picture, just notes\n')
    # Images whose extension names another format are decoded by content, not counted.
    (folder / 'jpeg_named.png').write_bytes(_encoded('JPEG'))
    (folder / 'png_named.jpg').write_bytes(_encoded('PNG'))
    dataset = build(data_root=root, max_corrupt_images=len(BROKEN))
    paths = [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]
    broken = [i for i, p in enumerate(paths) if osp.basename(p) in BROKEN]
    assert len(paths) == 9 and len(broken) == len(BROKEN)

    with mmlogger_records() as records:
        np.random.seed(0)
        samples = [dataset[i] for i in range(len(dataset))]   # broken: replaced by a good one
    assert all(s['inputs'].shape[0] == 3 for s in samples)
    messages = ' '.join(r.getMessage() for r in records)
    for name in BROKEN:
        assert f'{osp.join(folder, name)}: cannot' in messages, (name, messages)
    assert 'jpeg_named' not in messages and 'png_named' not in messages
    assert sorted(dataset.corrupt_images) == sorted(paths[i] for i in broken)
    dataset[broken[0]]  # a file already counted does not count again

    strict = build(data_root=root, max_corrupt_images=1)
    with pytest.raises(RuntimeError, match='2 broken images, more than max_corrupt_images=1'):
        strict[broken[0]]
        strict[broken[1]]


def test_grayscale_rgba_cmyk_16bit_and_small_images_train_normally(tmp_path):
    folder = tmp_path / 'data' / 'odd'
    folder.mkdir(parents=True)
    rng = np.random.RandomState(0)
    rgb = rng.randint(0, 256, (50, 60, 3), dtype=np.uint8)
    Image.fromarray(rgb[..., 0]).save(folder / 'gray.png')
    Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(folder / 'rgba.png')
    Image.fromarray(rgb).convert('CMYK').save(folder / 'cmyk.jpg')
    Image.fromarray(rgb[..., 0].astype(np.uint16) * 257).save(folder / 'sixteen_bit.png')
    Image.fromarray(rgb[:9, :7]).save(folder / 'small.png')   # smaller than any crop

    cfg = Config.fromfile(DEMO_CONFIG)
    dataset_cfg = dict(cfg.train_dataloader.dataset, data_root=str(tmp_path / 'data'),
                       max_corrupt_images=0)
    dataset = DATASETS.build(dataset_cfg)
    batch = default_collate([dataset[i] for i in range(len(dataset))])
    assert [tuple(v.shape) for v in batch['inputs']] == (
        [(5, 3, 32, 32)] * 2 + [(5, 3, 16, 16)] * 4)
    assert dataset.corrupt_images == []
