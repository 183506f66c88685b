"""Bad input met where users meet it, through ``tools/train.py``: misnamed, empty and text
files in the image folder, symlink loops and odd entries in it, and a model whose widths
do not fit."""
import io
import os
import subprocess
import sys

from PIL import Image

from tests.helpers import DEMO_CONFIG, REPO, make_image_folder


def train(data_root, work_dir, *options, config=DEMO_CONFIG) -> subprocess.CompletedProcess:
    """One epoch of `config` on `data_root` (4 images a batch, no workers)."""
    cmd = [sys.executable, str(REPO / 'tools' / 'train.py'), str(config),
           '--work-dir', str(work_dir), '--cfg-options',
           f'train_dataloader.dataset.data_root={data_root}',
           'train_dataloader.batch_size=4', 'train_dataloader.num_workers=0',
           'train_dataloader.persistent_workers=False', 'train_cfg.max_epochs=1', *options]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _as(fmt: str, path) -> bytes:
    buffer = io.BytesIO()
    Image.open(path).save(buffer, format=fmt)
    return buffer.getvalue()


def test_misnamed_images_train_and_empty_or_text_files_are_named_as_such(tmp_path):
    # 8 entries, 2 full batches: every file is read once
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=6)
    folder = tmp_path / 'data' / 'class_0'
    (folder / '0.png').write_bytes(_as('JPEG', folder / '0.png'))   # a JPEG named .png
    os.rename(folder / '1.png', folder / '1.jpg')                   # a PNG named .jpg
    (folder / 'empty.png').write_bytes(b'')
    (folder / 'notes.jpg').write_text('these are notes, not a picture\n')
    # Two broken files fit the budget; the two misnamed images must not count against it.
    # (The demo config leaves the budget at its default, so a derived config sets it.)
    config = tmp_path / 'budget_2.py'
    config.write_text(f'_base_ = [{DEMO_CONFIG!r}]\n'
                      'train_dataloader = dict(dataset=dict(max_corrupt_images=2))\n')
    result = train(root, tmp_path / 'work', config=config)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert 'empty.png: empty file.' in log
    assert 'notes.jpg: not an image (text).' in log
    assert 'truncated' not in log
    assert log.count('although its extension says') == 1
    assert 'Epoch(train) [1][2/2]' in log


def test_symlink_loops_and_odd_entries_do_not_stop_training_and_are_summarised(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=4)
    folder = tmp_path / 'data' / 'class_0'
    os.symlink('..', folder / 'loop')               # recursion without end
    os.symlink('self.png', folder / 'self.png')     # a link to itself
    os.symlink('missing.png', folder / 'gone.png')  # dangling
    os.mkfifo(folder / 'pipe.png')
    (folder / 'x.png').mkdir()
    result = train(root, tmp_path / 'work')
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert f'Ignored 5 entries under {root!r}' in log
    for part in ('2 x symlink loop: ', 'class_0/loop/', 'class_0/self.png',
                 '1 x dangling symlink (its target does not exist): class_0/gone.png',
                 '1 x not a regular file (FIFO): class_0/pipe.png',
                 '1 x folder named like an image', 'class_0/x.png/'):
        assert part in log, part
    assert 'Epoch(train) [1][1/1]' in log


def test_mismatched_widths_stop_the_run_at_build_time_naming_the_keys(tmp_path):
    root = make_image_folder(tmp_path / 'data', classes=1, per_class=4)
    result = train(root, tmp_path / 'work', 'model.neck.in_channels=64',
                   'model.head.out_channels=512', 'model.decoder_head.in_channels=32')
    log = result.stdout + result.stderr
    assert result.returncode != 0
    for line in (
            'model.neck.in_channels=64 but the backbone (MaskViT with a custom arch) outputs '
            '96 channels: set model.neck.in_channels=96.',
            'model.head.out_channels=512 but model.neck.out_channels=1024 (the number of '
            'prototypes): set model.head.out_channels=1024 (or model.neck.out_channels=512).',
            'model.decoder_head.in_channels=32 but the backbone (MaskViT with a custom arch) '
            'outputs 96 channels: set model.decoder_head.in_channels=96.'):
        assert line in log, log[-3000:]
    assert 'Epoch(train)' not in log and 'mat1 and mat2' not in log


def test_test_py_on_a_pretraining_config_says_what_to_run_instead(tmp_path):
    checkpoint = tmp_path / 'epoch_10.pth'   # never opened: the config is refused first
    cmd = [sys.executable, str(REPO / 'tools' / 'test.py'), DEMO_CONFIG, str(checkpoint)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert 'is a pretraining config (model type MST)' in result.stderr
    # The k-NN config of the same (demo) backbone, with the checkpoint filled in; the DeiT-S
    # benchmarks do not fit the demo's tiny ViT and are not offered.
    assert ('python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_vit-tiny_demo.py '
            f'{checkpoint}') in result.stderr
    assert 'deit-s' not in result.stderr
    assert f'--resume {checkpoint}' in result.stderr
    assert '_test_loop' not in result.stderr and 'Traceback' not in result.stderr


def test_check_test_config_offers_the_benchmarks_of_the_same_backbone():
    import pytest
    from mmengine.config import Config

    from mst_mm.engine import NotATestConfigError
    from mst_mm.engine.cli import check_test_config
    cfg = Config(dict(model=dict(type='MST')))
    with pytest.raises(NotATestConfigError) as error:
        check_test_config(cfg, 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 'C.pth')
    message = str(error.value)
    for expected in (
            'knn_eval.py configs/benchmarks/knn/knn_deit-s_in1k.py C.pth',
            'tools/train.py configs/benchmarks/classification/'
            'linear_deit-s_cls-last_8xb128-100e_in1k.py --cfg-options '
            'model.backbone.init_cfg.checkpoint=C.pth',
            'mst2downstream.py C.pth pretrain/mst_deit-s_mmseg.pth --target mmseg, then '
            'python tools/train.py configs/benchmarks/mmsegmentation/'):
        assert expected in message, message
    assert 'swin' not in message and 'vit-tiny' not in message
    # A config with a test split passes; one without and no MST says what it lacks.
    check_test_config(Config(dict(test_dataloader=dict(), test_evaluator=dict())), 'x.py', 'c')
    with pytest.raises(NotATestConfigError, match='x.py has no test_evaluator'):
        check_test_config(Config(dict(model=dict(type='ImageClassifier'),
                                      test_dataloader=dict())), 'x.py', 'c')
