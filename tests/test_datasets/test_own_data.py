"""Your own images with the real pretraining configs: a flat folder, class sub-folders and
ImageNet's layout all load through the DeiT-S config's dataset and multi-crop pipeline by
changing only data_root, and a wrong layout gets an error that says what is expected."""
import os.path as osp

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from mmpretrain.registry import DATASETS
from PIL import Image

import mst_mm  # noqa: F401
from mst_mm.datasets import detect_layout
from tests.helpers import REPO, make_image_folder

DEIT_S_CONFIG = str(REPO / 'configs' / 'mst' / 'mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
# Every ImageNet-scale pretraining config (DeiT-S, Swin-T, ablations, under old and new names).
# The demo configs set their own 32-px dataset and are left out here.
PRETRAIN_CONFIGS = sorted(
    str(path.relative_to(REPO)) for path in (REPO / 'configs').rglob('*.py')
    if not {'_base_', 'benchmarks'} & set(path.parts) and 'demo' not in path.name)
PIPELINE = [dict(type='LoadImageOrSkip'), dict(type='PackInputs')]


def _save(path, seed=0, size=(36, 44)):
    rng = np.random.RandomState(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.randint(0, 256, (*size, 3), dtype=np.uint8)).save(path)


def flat_folder(root):
    """Images at the top and one level down, no classes: 5 images."""
    for i in range(3):
        _save(root / f'holiday_{i}.jpg', seed=i)
    for i in range(2):
        _save(root / 'more' / f'{i}.png', seed=10 + i)
    return 5


def class_folders(root):
    """6 classes of 2 images: the folder the old ImageNet config refused (6 != 1000)."""
    make_image_folder(root, classes=6, per_class=2, size=(36, 44))
    return 12


def imagenet_with_meta(root):
    """ImageNet's layout with meta/train.txt listing 3 of the 4 images in train/."""
    make_image_folder(root / 'train', classes=2, per_class=2, size=(36, 44))
    make_image_folder(root / 'val', classes=2, per_class=1, size=(36, 44))
    (root / 'meta').mkdir()
    (root / 'meta' / 'train.txt').write_text('class_0/0.png 0\nclass_0/1.png 0\n'
                                             'class_1/0.png 1\n')
    return 3


def imagenet_class_folders(root):
    """ImageNet's layout without meta/: train/ holds class folders; val/ is not read."""
    make_image_folder(root / 'train', classes=3, per_class=2, size=(36, 44))
    make_image_folder(root / 'val', classes=3, per_class=1, size=(36, 44))
    return 6


LAYOUT_CASES = [
    (flat_folder, 'flat', False),
    (class_folders, 'class_folders', True),
    (imagenet_with_meta, 'imagenet', True),
    (imagenet_class_folders, 'imagenet', True),
]


def deit_s_loader(data_root, batch_size=2):
    """The DeiT-S pretraining config's train dataloader, only data_root changed (plus the
    worker settings a test needs)."""
    cfg = Config.fromfile(DEIT_S_CONFIG)
    init_default_scope(cfg.default_scope)
    loader_cfg = cfg.train_dataloader
    loader_cfg.dataset.data_root = str(data_root)
    loader_cfg.update(batch_size=batch_size, num_workers=0, persistent_workers=False,
                      pin_memory=False)
    return Runner.build_dataloader(loader_cfg, seed=0)


@pytest.mark.parametrize('config', PRETRAIN_CONFIGS)
def test_every_pretraining_config_finds_the_layout_from_data_root(config):
    dataset = Config.fromfile(str(REPO / config)).train_dataloader.dataset
    assert dataset.type == 'PretrainImageFolder' and dataset.data_layout == 'auto'
    # The evidence recipes read the object images tools/misc/write_animal_shapes.py writes.
    expected_root = ('data/animal_shapes/objects' if config.endswith('_animals.py')
                     else 'data/imagenet/')
    assert dataset.data_root == expected_root and dataset.split == 'train'


@pytest.mark.parametrize('make, layout, labelled', LAYOUT_CASES,
                         ids=[case[0].__name__ for case in LAYOUT_CASES])
def test_the_deit_s_config_pretrains_on_each_layout_by_changing_only_data_root(
        tmp_path, make, layout, labelled):
    num_images = make(tmp_path / 'data')
    loader = deit_s_loader(tmp_path / 'data')
    dataset = loader.dataset
    assert type(dataset).__name__ == 'PretrainImageFolder'
    assert dataset.data_layout == layout and dataset.layout_source == 'found'
    assert len(dataset) == num_images
    assert all(osp.isfile(dataset.get_data_info(i)['img_path']) for i in range(num_images))
    assert ('gt_label' in dataset.get_data_info(0)) == labelled

    batch = next(iter(loader))
    # DINO's ViT-S multi-crop: 2 global crops of 224 px, 8 local crops of 96 px.
    assert [tuple(view.shape) for view in batch['inputs']] == (
        [(2, 3, 224, 224)] * 2 + [(2, 3, 96, 96)] * 8)
    assert len(batch['data_samples']) == 2


def test_class_folders_keep_their_names_and_imagenet_meta_gives_labels(tmp_path):
    class_folders(tmp_path / 'six')
    six = deit_s_loader(tmp_path / 'six').dataset
    assert six.metainfo['classes'] == tuple(f'class_{c}' for c in range(6))
    imagenet_with_meta(tmp_path / 'in')
    listed = deit_s_loader(tmp_path / 'in').dataset
    assert [listed.get_data_info(i)['gt_label'] for i in range(3)] == [0, 0, 1]
    assert listed.ann_file.endswith(osp.join('meta', 'train.txt'))
    assert all('/train/' in listed.get_data_info(i)['img_path'] for i in range(3))


def test_detect_layout_rules(tmp_path):
    flat_folder(tmp_path / 'flat')
    class_folders(tmp_path / 'classes')
    imagenet_class_folders(tmp_path / 'in')
    assert detect_layout(str(tmp_path / 'flat')) == 'flat'
    assert detect_layout(str(tmp_path / 'classes')) == 'class_folders'
    assert detect_layout(str(tmp_path / 'in')) == 'imagenet'
    # ImageNet's train/ folder itself is a class-folder dataset.
    assert detect_layout(str(tmp_path / 'in' / 'train')) == 'class_folders'
    assert detect_layout(str(tmp_path / 'in'), split='val') == 'imagenet'
    (tmp_path / 'empty').mkdir()
    with pytest.raises(RuntimeError, match="(?s)holds no images .* data_layout='flat'"):
        detect_layout(str(tmp_path / 'empty'))


def build(**kwargs):
    return DATASETS.build(dict(type='PretrainImageFolder', pipeline=PIPELINE, **kwargs))


def test_a_forced_layout_is_used_and_wrong_settings_say_what_to_do(tmp_path):
    class_folders(tmp_path / 'classes')
    flat = build(data_root=str(tmp_path / 'classes'), data_layout='flat')
    assert flat.data_layout == 'flat' and flat.layout_source == 'given'
    assert len(flat) == 12 and 'gt_label' not in flat.get_data_info(0)

    with pytest.raises(FileNotFoundError, match=r"(?s)data_layout='imagenet' reads the images "
                       r".*classes/train.*data_layout='auto'"):
        build(data_root=str(tmp_path / 'classes'), data_layout='imagenet')
    with pytest.raises(ValueError, match="data_layout must be 'auto' or one of"):
        build(data_root=str(tmp_path / 'classes'), data_layout='folders')
    with pytest.raises(ValueError, match="sets ann_file .*type='CheckedImageDataset'"):
        build(data_root=str(tmp_path / 'classes'), ann_file='meta/train.txt')
    with pytest.raises(FileNotFoundError, match=r"(?s)data_root '.*nowhere' does not exist.*"
                       r"data_layout='class_folders'"):
        build(data_root=str(tmp_path / 'nowhere'))
    (tmp_path / 'no_images' / 'a').mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"(?s)No images .* as data_layout='class_folders' "
                       r"\(found\), which expects <data_root>/<class>"):
        build(data_root=str(tmp_path / 'no_images'))


def test_the_fixed_layout_dataset_describes_its_layout_and_points_to_the_switch(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"CheckedImageDataset expects "
                       r"<data_root>/<class>/<image>.*type='PretrainImageFolder'"):
        DATASETS.build(dict(type='CheckedImageDataset', data_root=str(tmp_path / 'nowhere'),
                            pipeline=PIPELINE))
