"""The evidence run's supervised row (mst_research.recipes): the evidence ViT trained
with labels on a tiny class-folder set, then embedded as the probe embeds an MST teacher."""
import os

import numpy as np
import pytest
import torch
from kit_helpers import REPO, scalars
from mmengine.config import Config
from mmengine.runner import EpochBasedTrainLoop, set_random_seed
from mmpretrain.registry import DATASETS, MODELS
from PIL import Image

from mst_mm.engine.safe_loading import read_checkpoint
from mst_mm.models.algorithms.feature_embedder import embed_images
from mst_research.data import image_batches, load_class_folders
from mst_research.recipes import load_supervised_backbone, supervised_config, train_supervised

VIT_CONFIG = str(REPO / 'configs' / 'mst' / 'mst_vit-tiny-p4_1xb64-coslr-6e_animals.py')
CLASSES, PER_CLASS, EPOCHS, BATCH = 3, 8, 12, 4
INDICES = [i for i in range(CLASSES * PER_CLASS) if i % PER_CLASS < 6]   # 6 of 8 a class
ITERS_PER_EPOCH = -(-len(INDICES) // BATCH)   # the last, short batch is kept
# In-process loading, a log line per iteration, unsmoothed: the loss of each step.
QUIET = dict(train_dataloader=dict(num_workers=0, persistent_workers=False),
             log_level='WARNING', default_hooks=dict(logger=dict(interval=1)),
             log_processor=dict(window_size=1))


def write_bands(root) -> str:
    """``root/train/<class>/*.png``: grey noise with a bright band, top, bottom or middle
    (classes that a horizontal flip and a 4-px shift keep apart); returns ``root``."""
    rng = np.random.RandomState(0)
    bands = [slice(0, 16), slice(16, 32), slice(10, 22)]
    for c in range(CLASSES):
        folder = root / 'train' / f'class_{c}'
        folder.mkdir(parents=True)
        for i in range(PER_CLASS):
            image = rng.randint(60, 100, (32, 32, 3)).astype(np.uint8)
            image[bands[c]] += 120
            Image.fromarray(image).save(folder / f'{i}.png')
    return str(root)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """One seeded run on the INDICES images: (pretraining config, objects root, work dir,
    final checkpoint)."""
    torch.set_num_threads(1)
    root = write_bands(tmp_path_factory.mktemp('objects'))
    work_dir = str(tmp_path_factory.mktemp('supervised'))
    cfg = Config.fromfile(VIT_CONFIG)
    checkpoint = train_supervised(cfg, root, work_dir, EPOCHS, seed=0, indices=INDICES,
                                  batch_size=BATCH, cfg_options=QUIET)
    return cfg, root, work_dir, checkpoint


def read(checkpoint: str) -> dict:
    return read_checkpoint(checkpoint, map_location='cpu')


def test_the_checkpoint_holds_the_pretraining_teachers_backbone_shapes(trained):
    cfg, _, work_dir, checkpoint = trained
    assert checkpoint == os.path.join(work_dir, f'epoch_{EPOCHS}.pth')
    state = read(checkpoint)['state_dict']
    backbone = {k[len('backbone.'):]: v.shape for k, v in state.items()
                if k.startswith('backbone.')}
    teacher = MODELS.build(cfg.model).teacher.module[0]   # the backbone that the probe embeds
    assert backbone == {k: v.shape for k, v in teacher.state_dict().items()}
    assert backbone['cls_token'] == (1, 1, 48) and backbone['pos_embed'] == (1, 1 + 8 * 8, 48)
    assert state['head.fc.weight'].shape == (CLASSES, 48)


def test_the_indices_alone_are_trained_on(trained):
    cfg, root, work_dir, checkpoint = trained
    assert read(checkpoint)['meta']['iter'] == EPOCHS * ITERS_PER_EPOCH   # 5, not 6, a epoch
    dataset = DATASETS.build(supervised_config(cfg, root, work_dir, EPOCHS, 0, INDICES,
                                               BATCH).train_dataloader.dataset)
    assert len(dataset) == len(INDICES) == 18
    paths = [os.path.relpath(dataset.get_data_info(i)['img_path'], os.path.join(root, 'train'))
             for i in range(len(dataset))]
    assert paths == [f'class_{c}/{i}.png' for c in range(CLASSES) for i in range(6)]


def test_the_loss_falls_and_the_training_accuracy_rises_above_chance(trained):
    steps = [r for r in scalars(trained[2]) if 'loss' in r]
    assert len(steps) == EPOCHS * ITERS_PER_EPOCH
    first, last = steps[:ITERS_PER_EPOCH], steps[-2 * ITERS_PER_EPOCH:]
    first_loss = np.mean([r['loss'] for r in first])
    assert first_loss == pytest.approx(np.log(CLASSES), abs=0.1)   # a near-uniform start
    assert np.mean([r['loss'] for r in last]) < first_loss - 0.1
    assert np.mean([r['accuracy_top-1'] for r in last]) > 100 / CLASSES + 15


def test_every_backbone_weight_moved_from_its_initialisation(trained):
    cfg, root, work_dir, checkpoint = trained
    backbone, _, _ = load_supervised_backbone(checkpoint, cfg)
    # The runner's init: seeded, built, initialised (LayerNorms at 1 and 0, biases at 0).
    set_random_seed(0)
    model = MODELS.build(supervised_config(cfg, root, work_dir, EPOCHS, 0).model)
    model.init_weights()
    init = model.backbone.state_dict()
    for name, value in backbone.state_dict().items():
        assert not torch.allclose(value, init[name]), name


def test_the_loaded_backbone_embeds_as_the_probe_does(trained):

    cfg, root, work_dir, checkpoint = trained
    backbone, mean, std = load_supervised_backbone(checkpoint, cfg)
    assert not backbone.training and type(backbone).__name__ == 'MaskViT'
    assert (mean, std) == ([127.5] * 3, [64.0] * 3)
    images, _, _ = load_class_folders(os.path.join(root, 'train'))
    feats, attn = embed_images(backbone, image_batches(images, 10), mean, std, with_attn=True)
    assert feats.shape == (CLASSES * PER_CLASS, 48) and attn.shape == (CLASSES * PER_CLASS, 64)
    # The features that the linear head was trained on: the final-normed CLS token.
    inputs = (torch.from_numpy(images).permute(0, 3, 1, 2).float() - 127.5) / 64.0
    with torch.no_grad():
        assert torch.allclose(feats, backbone(inputs)[-1], atol=1e-5)
    # The classifier as trained (its data preprocessor on BGR images, as LoadImageFromFile
    # reads them) gives the logits of its head on the probe's features: same normalisation.
    model = MODELS.build(supervised_config(cfg, root, work_dir, EPOCHS, 0).model)
    model.load_state_dict(read(checkpoint)['state_dict'])
    model.eval()
    bgr = torch.from_numpy(images[..., ::-1].copy()).permute(0, 3, 1, 2)
    with torch.no_grad():
        logits = model(model.data_preprocessor(dict(inputs=bgr))['inputs'], mode='tensor')
        assert torch.allclose(logits, model.head.fc(feats), atol=1e-5)


def test_a_rerun_of_a_finished_run_does_not_train(trained):
    cfg, root, work_dir, checkpoint = trained
    runs, mtime = sorted(os.listdir(work_dir)), os.path.getmtime(checkpoint)
    assert train_supervised(cfg, root, work_dir, EPOCHS, seed=0, indices=INDICES,
                            batch_size=BATCH, cfg_options=QUIET) == checkpoint
    assert os.path.getmtime(checkpoint) == mtime
    assert sorted(os.listdir(work_dir)) == runs   # no runner: no new timestamped log folder


def test_a_cut_run_resumes_from_its_last_epoch(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    root = write_bands(tmp_path / 'objects')
    work_dir = str(tmp_path / 'supervised')
    cfg = Config.fromfile(VIT_CONFIG)
    run_epoch = EpochBasedTrainLoop.run_epoch

    def cut_after_two(loop):
        if loop.runner.epoch == 2:
            raise KeyboardInterrupt
        run_epoch(loop)

    monkeypatch.setattr(EpochBasedTrainLoop, 'run_epoch', cut_after_two)
    with pytest.raises(KeyboardInterrupt):
        train_supervised(cfg, root, work_dir, 3, seed=0, batch_size=8, cfg_options=QUIET)
    assert not os.path.exists(os.path.join(work_dir, 'epoch_3.pth'))
    monkeypatch.setattr(EpochBasedTrainLoop, 'run_epoch', run_epoch)
    checkpoint = train_supervised(cfg, root, work_dir, 3, seed=0, batch_size=8,
                                  cfg_options=QUIET)
    assert read(checkpoint)['meta']['iter'] == 3 * 3
    # Each step once: epochs 1-2 in the cut run, epoch 3 alone in the resumed one.
    assert [r['step'] for r in scalars(work_dir, all_runs=True) if 'loss' in r] == \
        list(range(1, 10))
