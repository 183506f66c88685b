"""The k-NN and linear-probe configs for an own labelled folder (docs/own_data.md, "Evaluate
on your own labelled folder"): their dataloaders read train/ and val/ class folders, a k-NN
evaluation runs end to end through tools/analysis/knn_eval.py and a linear probe trains an
epoch through tools/train.py, with only the documented keys changed (and DeiT-S swapped for
DeiT-Ti, which a CPU runs in seconds)."""
import json
import shutil

import pytest
import torch
from mmengine.config import Config, DictAction
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

from mst_mm.utils.cli import merge_cfg_options
from tests.helpers import REPO, load_tool, make_image_folder, scalars

KNN = 'configs/benchmarks/knn/knn_deit-s_own-folder.py'
LINEAR = 'configs/benchmarks/classification/linear_deit-s_cls-last_own-folder.py'
# CPU test settings: no worker processes, one batch per split (the k-NN reference loader
# sets no persistent_workers or pin_memory).
LOADER = ('batch_size=6', 'num_workers=0', 'persistent_workers=False', 'pin_memory=False')
REFERENCE_LOADER = LOADER[:2]


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """2 classes x 3 images in train/ and val/; val/ holds copies of train/'s images, so a
    1-NN vote finds each query's own image and must be right when the labels line up."""
    root = tmp_path_factory.mktemp('pets')
    make_image_folder(root / 'train', classes=2, per_class=3, size=(40, 48), seed=0)
    shutil.copytree(root / 'train', root / 'val')
    return root


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """An MST-style checkpoint whose EMA teacher is a random DeiT-Ti."""
    from mmpretrain.registry import MODELS

    import mst_mm  # noqa: F401
    torch.manual_seed(0)
    vit = MODELS.build(dict(type='MaskViT', arch='deit-tiny', img_size=224, patch_size=16,
                            use_mask_token=True))
    path = tmp_path_factory.mktemp('ckpt') / 'mst.pth'
    torch.save({'state_dict': {f'teacher.module.0.{k}': v for k, v in
                               vit.state_dict().items()}}, path)
    return path


def knn_options(folder):
    return ([f'test_cfg.train_dataloader.dataset.data_root={folder / "train"}',
             f'test_dataloader.dataset.data_root={folder / "val"}']
            + [f'test_cfg.train_dataloader.{opt}' for opt in REFERENCE_LOADER]
            + [f'test_dataloader.{opt}' for opt in LOADER])


def linear_options(folder, checkpoint):
    return ([f'model.backbone.init_cfg.checkpoint={checkpoint}', 'model.head.num_classes=2',
             f'train_dataloader.dataset.data_root={folder / "train"}',
             f'val_dataloader.dataset.data_root={folder / "val"}',
             f'test_dataloader.dataset.data_root={folder / "val"}']
            + [f'{loader}.{opt}' for loader in ('train_dataloader', 'val_dataloader')
               for opt in LOADER])


@pytest.mark.parametrize('config', [KNN, LINEAR])
def test_dataloaders_read_the_two_class_folders(config, folder):
    import mst_mm  # noqa: F401  (registers CheckedImageDataset)
    cfg = Config.fromfile(str(REPO / config))
    options = knn_options(folder) if config == KNN else linear_options(folder, 'unused.pth')
    merge_cfg_options(cfg, {key: DictAction._parse_iterable(value) for key, value in
                            (option.split('=', 1) for option in options)})
    loaders = ({'train': cfg.test_cfg.train_dataloader, 'val': cfg.test_dataloader}
               if config == KNN else
               {'train': cfg.train_dataloader, 'val': cfg.val_dataloader})
    for split, loader_cfg in loaders.items():
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            loader = Runner.build_dataloader(loader_cfg)
        assert loader.dataset.metainfo['classes'] == ('class_0', 'class_1'), split
        batch = next(iter(loader))
        labels = [int(s.gt_label) for s in batch['data_samples']]
        shuffled = config == LINEAR and split == 'train'  # the probe's train loader shuffles
        assert (sorted(labels) if shuffled else labels) == [0, 0, 0, 1, 1, 1], split
        # Every image comes out at the 224 px the DeiT-S backbone takes.
        assert {tuple(x.shape) for x in batch['inputs']} == {(3, 224, 224)}, split


def test_knn_eval_runs_on_the_own_folder_config(folder, checkpoint, tmp_path):
    out = tmp_path / 'knn.json'
    result = load_tool('tools/analysis/knn_eval.py').main(
        [str(REPO / KNN), str(checkpoint), '--ks', '1', '3', '--out', str(out),
         '--work-dir', str(tmp_path / 'work'), '--cfg-options', 'model.backbone.arch=deit-tiny',
         *knn_options(folder)])
    # Each query is a copy of a reference image: its nearest neighbour, itself, votes right.
    assert result[1] == 100.0
    assert 0.0 <= result[3] <= 100.0
    assert json.loads(out.read_text()) == {'top1_k1': 100.0, 'top1_k3': result[3]}


def test_linear_probe_trains_an_epoch_through_tools_train(folder, checkpoint, tmp_path):
    work = tmp_path / 'work'
    load_tool('tools/train.py').main(
        [str(REPO / LINEAR), '--work-dir', str(work), '--cfg-options',
         'model.backbone.arch=deit-tiny', 'model.head.in_channels=192',
         'train_cfg.max_epochs=1', 'train_cfg.val_interval=1', 'default_hooks.logger.interval=1',
         *linear_options(folder, checkpoint)])
    logged = scalars(str(work))
    assert any('loss' in line for line in logged)                 # one training iteration
    assert [line['accuracy/top1'] for line in logged if 'accuracy/top1' in line]  # validated
    state = torch.load(work / 'epoch_1.pth', map_location='cpu', weights_only=False)
    teacher = torch.load(checkpoint, weights_only=True)['state_dict']
    # The backbone is the checkpoint's teacher, left frozen; the linear head has 2 outputs.
    for key, value in state['state_dict'].items():
        if key.startswith('backbone.'):
            torch.testing.assert_close(value, teacher['teacher.module.0.' + key[9:]], msg=key)
    assert state['state_dict']['head.fc.weight'].shape == (2, 192)
