"""Broken data: missing roots and files fail at start-up, broken images are skipped within
a budget, and unusual image modes train like any other."""
import contextlib
import io
import os
import os.path as osp
import re
import time

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


def _write_broken_images(folder):
    good = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(good, format='JPEG')
    (folder / 'truncated.jpg').write_bytes(good.getvalue()[:len(good.getvalue()) // 2])
    (folder / 'garbage.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'not an image' * 10)


def test_broken_images_are_skipped_with_a_warning_then_stop_past_the_budget(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=3)
    _write_broken_images(tmp_path / 'data' / 'class_0')
    dataset = build(data_root=root, max_corrupt_images=2)
    paths = [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]
    broken = [i for i, p in enumerate(paths) if 'truncated' in p or 'garbage' in p]
    assert len(broken) == 2

    with mmlogger_records() as records:
        np.random.seed(0)
        samples = [dataset[i] for i in broken]   # each replaced by a good image
    assert all(s['inputs'].shape[0] == 3 for s in samples)
    messages = ' '.join(r.getMessage() for r in records)
    assert 'truncated.jpg: truncated JPEG' in messages and 'garbage.png' in messages
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


def _encoded(fmt: str, size=(20, 24)) -> bytes:
    buffer = io.BytesIO()
    rgb = np.random.RandomState(1).randint(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(buffer, format=fmt)
    return buffer.getvalue()


def test_image_problem_judges_the_format_by_content_not_by_name():
    from mst_mm.datasets.image_format import image_problem, sniff_image_format
    from mst_mm.datasets.image_format import undecodable_reason as reason
    jpeg, png = _encoded('JPEG'), _encoded('PNG')
    assert sniff_image_format(jpeg) == 'JPEG' and sniff_image_format(png) == 'PNG'
    assert image_problem(jpeg, 'photo.png') is None
    assert image_problem(png, 'photo.jpg') is None
    # trailers after EOI/IEND (some cameras and tools append data) are not truncation
    assert image_problem(jpeg + bytes(range(256)), 'photo.jpg') is None
    assert image_problem(png + b'junk' * 40, 'photo.png') is None
    assert image_problem(jpeg[:len(jpeg) // 2], 'a.png') == 'truncated JPEG (no EOI marker)'
    assert image_problem(png[:len(png) // 2], 'a.jpg') == 'truncated PNG (no IEND chunk)'
    bmp = _encoded('BMP')
    assert image_problem(bmp[:100]).startswith('truncated BMP (100 of the ')
    assert image_problem(b'', 'a.png') == 'empty file'
    assert reason(b'a,b,c\n1,2,3\n') == 'not an image (text)'
    assert reason(b'<!DOCTYPE html><p>404</p>').startswith(
        'not an image (an HTML page')
    assert reason(b'%PDF-1.4\n\x00\x01') == 'not an image (PDF document)'
    assert reason(b'\x00\x01\x02\x03garbage').startswith(
        'not an image (unknown format, starts with 00 01 02 03')
    assert reason(png[:16] + b'\x00' * 64) == (
        'corrupt PNG (the decoder could not read it)')


def test_misnamed_images_load_and_empty_or_text_files_get_their_true_reason(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=1)
    folder = tmp_path / 'data' / 'class_0'
    (folder / 'jpeg_named.png').write_bytes(_encoded('JPEG'))
    (folder / 'png_named.jpg').write_bytes(_encoded('PNG'))
    (folder / 'also_jpeg.png').write_bytes(_encoded('JPEG'))
    (folder / 'empty.png').write_bytes(b'')
    (folder / 'notes.jpg').write_text('not a picture, just notes\n')
    dataset = build(data_root=root, max_corrupt_images=2)
    names = [osp.basename(dataset.get_data_info(i)['img_path']) for i in range(len(dataset))]

    with mmlogger_records() as records:
        load = dataset.pipeline.transforms[0]   # LoadImageOrSkip, before PackInputs
        loaded = {name: load(dataset.get_data_info(i)) for i, name in enumerate(names)}
    for name in ('0.png', 'jpeg_named.png', 'png_named.jpg', 'also_jpeg.png'):
        assert loaded[name]['img'].shape[2] == 3, name
    assert loaded['empty.png'] is None and loaded['notes.jpg'] is None
    messages = [r.getMessage() for r in records]
    assert any(m.endswith('empty.png: empty file.') for m in messages), messages
    assert any(m.endswith('notes.jpg: not an image (text).') for m in messages), messages
    assert not any('truncated' in m for m in messages), messages
    # one warning per loader process that extensions can mislead, not one per file
    assert sum('although its extension says' in m for m in messages) == 1, messages


def _odd_entries(folder):
    """A symlink loop back to the data root, a link to itself, a dangling link, a FIFO, a
    folder named like an image and a non-image file, beside the images."""
    os.symlink('..', folder / 'loop')
    os.symlink('self.png', folder / 'self.png')
    os.symlink('missing.png', folder / 'dangling.png')
    os.mkfifo(folder / 'pipe.png')
    (folder / 'folder.png').mkdir()
    (folder / 'notes.txt').write_text('labels were taken from the folder names')


def test_symlink_loops_and_odd_entries_are_left_out_with_one_summary(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=2, per_class=2)
    _odd_entries(tmp_path / 'data' / 'class_0')
    os.symlink('.', tmp_path / 'data' / 'root_loop')   # would be a class of its own

    with mmlogger_records() as records:
        dataset = build(data_root=root)
    assert dataset.CLASSES == ('class_0', 'class_1')
    assert sorted(osp.relpath(dataset.get_data_info(i)['img_path'], root)
                  for i in range(len(dataset))) == [
        'class_0/0.png', 'class_0/1.png', 'class_1/0.png', 'class_1/1.png']
    summaries = [r.getMessage() for r in records if 'Ignored' in r.getMessage()]
    assert len(summaries) == 1, [r.getMessage() for r in records]
    summary = summaries[0]
    assert summary.startswith(f'Ignored 7 entries under {root!r}')
    for part in ('3 x symlink loop: ', 'class_0/loop/', 'class_0/self.png', 'root_loop/',
                 '1 x dangling symlink (its target does not exist): class_0/dangling.png',
                 '1 x not a regular file (FIFO): class_0/pipe.png',
                 '1 x folder named like an image', 'class_0/folder.png/',
                 "1 x file extension not in the dataset's `extensions`: class_0/notes.txt"):
        assert part in summary, (part, summary)


def test_a_healthy_folder_lists_exactly_as_mmpretrain_does(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=3, per_class=3)
    nested = tmp_path / 'data' / 'class_1' / 'nested' / 'deeper'
    make_image_folder(nested, classes=1, per_class=2)
    make_image_folder(tmp_path / 'data' / 'class_2' / '.hidden_folder', classes=1,
                      per_class=1)
    (tmp_path / 'data' / 'class_0' / '.DS_Store').write_bytes(b'\x00\x00\x00\x01Bud1')
    os.symlink(tmp_path / 'data' / 'class_0', tmp_path / 'data' / 'class_2' / 'linked')
    for with_label in (True, False):
        ours = build(data_root=root, with_label=with_label)
        theirs = DATASETS.build(dict(type='CustomDataset', data_root=root, pipeline=PIPELINE,
                                     with_label=with_label))
        assert ours.load_data_list() == theirs.load_data_list()
        assert ours.metainfo == theirs.metainfo


def test_files_that_are_not_regular_files_are_named_as_such(tmp_path):
    import threading

    from mmpretrain.registry import TRANSFORMS
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=1)
    folder = tmp_path / 'data' / 'class_0'
    _odd_entries(folder)
    ann = tmp_path / 'ann.txt'
    ann.write_text('class_0/0.png\nclass_0/pipe.png\nclass_0/dangling.png\n'
                   'class_0/self.png\nclass_0/folder.png\n')
    with pytest.raises(FileNotFoundError, match=re.escape(
            '4 of the 5 images that')) as error:
        build(data_root=root, ann_file=str(ann), with_label=False)
    for part in ('pipe.png (not a regular file (FIFO))', 'dangling.png (dangling symlink',
                 'self.png (symlink loop)'):
        assert part in str(error.value)

    # Without the start-up check, a FIFO must not block the loader: a writer that opens
    # and closes it later only unblocks a reader that should never have waited.
    def unblock():
        time.sleep(3)
        with contextlib.suppress(OSError):   # no reader left: nothing to unblock
            os.close(os.open(folder / 'pipe.png', os.O_WRONLY | os.O_NONBLOCK))
    threading.Thread(target=unblock, daemon=True).start()
    load = TRANSFORMS.build(dict(type='LoadImageOrSkip'))
    start = time.monotonic()
    assert load(dict(img_path=str(folder / 'pipe.png'))) is None
    assert load(dict(img_path=str(folder / 'folder.png'))) is None
    assert time.monotonic() - start < 2
