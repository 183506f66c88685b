"""tools/analysis/browse_dataset.py: the picture of a config's training views, for the three
ways the configs make them (whole views in the workers; worker crops + BatchViewAugment in
the preprocessor, the ImageNet configs; BatchMultiCrop in the preprocessor, the evidence
config), with its size, its number of views and its colours checked."""
import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from mst_mm.errors import UserInputError
from mst_mm.visualization import multicrop_views, views_grid
from tests.helpers import REPO, load_tool

IMAGENET = str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
EVIDENCE = str(REPO / 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py')
PLAIN = dict(type='SelfSupDataPreprocessor', mean=[123.675, 116.28, 103.53],
             std=[58.395, 57.12, 57.375], to_rgb=True)


def jpeg_folder(root, sizes=((60, 80), (100, 70), (90, 90)), colour=None):
    """A flat folder of JPEGs of different sizes: random, or of one RGB colour."""
    root.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes):
        pixels = (np.broadcast_to(np.uint8(colour), (*size, 3)) if colour is not None else
                  np.random.RandomState(i).randint(0, 256, (*size, 3), dtype=np.uint8))
        Image.fromarray(np.ascontiguousarray(pixels)).save(root / f'{i}.jpg', quality=95)
    return str(root)


def imagenet_cfg(data_root, **multicrop):
    cfg = Config.fromfile(IMAGENET)
    cfg.train_dataloader.dataset.data_root = data_root
    cfg.train_dataloader.dataset.pipeline[1].update(multicrop)
    return cfg


def grid_size(rows, view_sizes, zoom=1, pad=2):
    """(height, width) of views_grid's picture: cells as tall as the largest view."""
    return (rows * max(view_sizes) * zoom + (rows + 1) * pad,
            sum(view_sizes) * zoom + (len(view_sizes) + 1) * pad)


def test_imagenet_config_picture_shows_the_batched_augmentations(tmp_path):
    data_root = jpeg_folder(tmp_path / 'photos')
    out = tmp_path / 'views.png'
    tool = load_tool('tools/analysis/browse_dataset.py')
    assert tool.main([IMAGENET, '--out', str(out), '--num-images', '3', '--cfg-options',
                      f'train_dataloader.dataset.data_root={data_root}']) == str(out)
    picture = np.array(Image.open(out))
    # 3 rows; 2 global views of 224 px, then 8 local ones of 96 px, drawn at their size.
    assert picture.shape == (*grid_size(3, [224] * 2 + [96] * 8), 3)
    views = multicrop_views(imagenet_cfg(data_root), num_images=3, seed=0)
    assert [v.shape for v in views] == [(3, 224, 224, 3)] * 2 + [(3, 96, 96, 3)] * 8
    # The tool draws the views in the same places: row 1's second global view.
    np.testing.assert_array_equal(picture[2 + 224 + 2:2 + 2 * 224 + 2, 228:452], views[1][1])
    # The same seed gives the same worker crops; the config's preprocessor (BatchViewAugment)
    # then blurs every first global view, which a preprocessor that only normalises leaves.
    cfg = imagenet_cfg(data_root)
    cfg.model.data_preprocessor = PLAIN
    crops = multicrop_views(cfg, num_images=3, seed=0)
    for image in range(3):
        assert not np.array_equal(views[0][image], crops[0][image])
        assert np.abs(views[0][image].astype(int) - crops[0][image]).mean() > 1


def test_per_image_views_and_their_colours(tmp_path):
    """Whole views made in the workers (MultiCrop, crops_only=False) with a preprocessor that
    only normalises; and a red image comes back red (mean, std and channel order undone)."""
    data_root = jpeg_folder(tmp_path / 'photos')
    cfg = imagenet_cfg(data_root, crops_only=False, global_size=48, local_size=24,
                       num_local_crops=3)
    cfg.model.data_preprocessor = PLAIN
    views = multicrop_views(cfg, num_images=2, seed=1)
    assert [v.shape for v in views] == [(2, 48, 48, 3)] * 2 + [(2, 24, 24, 3)] * 3
    assert views_grid(views, zoom=2).shape == (*grid_size(2, [48] * 2 + [24] * 3, zoom=2), 3)

    red = jpeg_folder(tmp_path / 'red', colour=(255, 0, 0))
    cfg = imagenet_cfg(red, global_size=32, local_size=16, num_local_crops=2)
    cfg.model.data_preprocessor = PLAIN    # crops only, nothing that changes colours
    for view in multicrop_views(cfg, num_images=3):
        pixels = view.reshape(-1, 3).astype(int)
        assert (np.abs(pixels - [255, 0, 0]) <= 3).all(), pixels.mean(0)


def test_evidence_config_picture_of_batch_multicrop_views(tmp_path):
    # The evidence data's layout: 32-px images in class folders under objects/train.
    for label in ('cat', 'dog'):
        jpeg_folder(tmp_path / 'objects' / 'train' / label, sizes=((32, 32), ) * 2)
    out = tmp_path / 'views.png'
    load_tool('tools/analysis/browse_dataset.py').main(
        [EVIDENCE, '--out', str(out), '--num-images', '4', '--cfg-options',
         f'train_dataloader.dataset.data_root={tmp_path / "objects"}'])
    # The workers only decode the 32-px images; BatchMultiCrop makes 2 global views of 32 px
    # and 4 local ones of 16 px, drawn 4 times larger (a global view at least 128 px).
    picture = np.array(Image.open(out))
    assert picture.shape == (*grid_size(4, [32] * 2 + [16] * 4, zoom=4), 3)
    cfg = Config.fromfile(EVIDENCE)
    cfg.train_dataloader.dataset.data_root = str(tmp_path / 'objects')
    views = multicrop_views(cfg, num_images=4)
    assert [v.shape for v in views] == [(4, 32, 32, 3)] * 2 + [(4, 16, 16, 3)] * 4
    # Views of one image differ: the crops are random, not the image resized.
    assert not np.array_equal(views[0], views[1])


def test_a_config_without_training_data_is_refused_by_name():
    cfg = Config.fromfile(str(REPO / 'configs/benchmarks/knn/knn_deit-s_in1k.py'))
    with pytest.raises(UserInputError, match='no train_dataloader'):
        multicrop_views(cfg)


def test_a_missing_data_root_is_one_message(tmp_path):
    with pytest.raises(UserInputError, match='does not exist'):
        multicrop_views(imagenet_cfg(str(tmp_path / 'nowhere')))
