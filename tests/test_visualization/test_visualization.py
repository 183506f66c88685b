"""visualize_mst.py writes the picture rows; the hook logs them during training."""
import glob
import warnings

import mmcv
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.visualization import draw_rows, mst_picture_row, upsample_patches
from mst_mm.visualization.mst_pictures import colour_spread, is_grey
from tests.helpers import DEMO_CONFIG, load_tool, make_image_folder, tiny_runner_cfg


def _demo_model():
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(DEMO_CONFIG).model)
    model.init_weights()
    model.teacher.update_parameters(torch.nn.Sequential(model.backbone, model.neck))
    return model


def test_picture_row_contents_follow_the_mask_rule():
    model = _demo_model()
    row = mst_picture_row(model, torch.randn(3, 32, 32), torch.Generator().manual_seed(0))
    assert row['image'].shape == (32, 32, 3) and row['image'].dtype == np.uint8
    assert row['attn'].shape == (8, 8) and row['attn_heads'].shape == (4, 8, 8)
    np.testing.assert_allclose(row['attn_heads'].mean(0), row['attn'], rtol=1e-5, atol=1e-7)
    assert row['candidates'].sum() == 64 // 8
    assert not (row['guided_mask'] & ~row['candidates']).any()
    assert row['reconstruction'].shape == (32, 32, 3)


def test_visualize_tool_writes_one_png_per_image(tmp_path):
    model = _demo_model()
    ckpt = tmp_path / 'mst.pth'
    torch.save({'state_dict': model.state_dict()}, ckpt)
    root = make_image_folder(tmp_path / 'img', classes=2, per_class=1)
    images = sorted(glob.glob(root + '/*/*.png'))   # class_0/0.png, class_1/0.png
    tool = load_tool('tools/analysis/visualize_mst.py')
    written = tool.main([DEMO_CONFIG, str(ckpt), *images, '--out-dir', str(tmp_path / 'out'),
                         '--grid'])
    # Same file name in two class folders: the folder keeps the pictures apart.
    assert [p.rsplit('/', 1)[-1] for p in written] == [
        'class_0_0_mst.png', 'class_1_0_mst.png', 'mst_pictures.png']
    for path in written:
        picture = mmcv.imread(path)
        assert picture is not None and picture.shape[0] > 50 and picture.shape[1] > 300
    grid = mmcv.imread(written[-1])
    assert grid.shape[0] > mmcv.imread(written[0]).shape[0]  # two rows are taller than one
    assert tool.row_labels(images) == ['class_0', 'class_1']   # the class, from the folder
    assert tool.row_labels(images, ['a', 'b']) == ['a', 'b']
    assert tool.row_labels(images, ['none']) == [None, None]


def test_visualize_tool_keeps_out_as_a_deprecated_name_of_out_dir(tmp_path, capsys):
    tool = load_tool('tools/analysis/visualize_mst.py')
    with pytest.warns(DeprecationWarning, match='--out is deprecated, use --out-dir'):
        args = tool.parse_args(['cfg.py', 'ckpt.pth', 'a.png', '--out', str(tmp_path)])
    assert args.out_dir == str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert tool.parse_args(['cfg.py', 'ckpt.pth', 'a.png', '--out-dir', 'x']).out_dir == 'x'
    for argv, message in ((['--out', 'x', '--out-dir', 'y'], 'give --out-dir only'),
                          ([], '--out-dir is required'),
                          (['--out-dir', 'x', '--labels', 'one', 'two'],
                           'one name per image: 1 images, 2 labels')):
        with pytest.raises(SystemExit):
            tool.parse_args(['cfg.py', 'ckpt.pth', 'a.png', *argv])
        assert message in capsys.readouterr().err


def test_upsampled_attention_covers_each_patch_with_its_value():
    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    pixels = upsample_patches(grid, (8, 12))
    assert pixels.shape == (8, 12)
    assert (pixels[:4, :4] == 0).all() and (pixels[4:, 8:] == 5).all()
    with pytest.raises(ValueError, match='does not tile a 9 x 12 image'):
        upsample_patches(grid, (9, 12))


def test_the_picture_names_rows_scales_attention_and_marks_every_masked_patch():
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    model = _demo_model()
    rows = [mst_picture_row(model, torch.randn(3, 32, 32), torch.Generator().manual_seed(s),
                            label=name) for s, name in enumerate(['brick', 'grass'])]
    fig = draw_rows(rows, max_heads=2)
    try:
        # Per row: input, mean, 2 heads, guided mask, random mask, reconstruction, colour bar.
        axes = np.array(fig.axes).reshape(2, 8)
        assert [axes[r, 0].get_ylabel() for r in range(2)] == ['brick', 'grass']
        assert axes[0, 1].get_title().startswith('attention, mean')
        assert 'num=8, p=0.1' in axes[0, 4].get_title()
        assert axes[0, 7].get_ylabel() == 'attention / uniform'
        assert sum(row['random_mask'].sum() for row in rows) > 0   # something to mark
        for r, row in enumerate(rows):
            # Attention is drawn over the image, in units of a uniform attention.
            heat = axes[r, 1].get_images()[-1]
            np.testing.assert_allclose(heat.get_array()[::4, ::4], row['attn'] * 64,
                                       rtol=1e-5)
            maps = np.concatenate([row['attn'][None], row['attn_heads'][:2]])
            assert heat.get_clim() == pytest.approx((maps.min() * 64, maps.max() * 64))
            guided = [p for p in axes[r, 4].patches if isinstance(p, Rectangle)]
            random = [p for p in axes[r, 5].patches if isinstance(p, Rectangle)]
            hatched = [p for p in guided if p.get_hatch()]
            outlined = [p for p in guided if not p.get_hatch()]
            assert len(hatched) == row['guided_mask'].sum()
            assert len(outlined) == (row['candidates'] & ~row['guided_mask']).sum()
            assert len(random) == row['random_mask'].sum() and all(
                p.get_hatch() for p in random)
        assert len(fig.legends[0].get_texts()) == 2
    finally:
        plt.close(fig)


def test_a_grey_input_shows_its_reconstruction_grey_and_names_the_colour_left_out():
    import matplotlib.pyplot as plt

    model = _demo_model()
    # The demo normalises every channel alike, so equal normalised channels are grey pixels.
    grey_input = torch.randn(1, 32, 32).expand(3, 32, 32)
    colour_input = torch.randn(3, 32, 32)
    rows = [mst_picture_row(model, grey_input), mst_picture_row(model, colour_input)]
    assert is_grey(rows[0]['image']) and not is_grey(rows[1]['image'])
    spread = colour_spread(rows[0]['reconstruction'])
    assert spread > 0   # an untrained decoder adds colour to a grey image
    fig = draw_rows(rows, max_heads=1)
    try:
        axes = np.array(fig.axes).reshape(2, 7)
        grey_panel, colour_panel = axes[0, 5].get_images()[0], axes[1, 5].get_images()[0]
        np.testing.assert_allclose(grey_panel.get_array(),
                                   rows[0]['reconstruction'].astype(np.float32).mean(-1))
        assert [t.get_text() for t in axes[0, 5].texts] == [
            f'shown grey\nRGB spread {spread:.0f}/255']
        np.testing.assert_array_equal(colour_panel.get_array(), rows[1]['reconstruction'])
        assert len(axes[1, 5].texts) == 0
    finally:
        plt.close(fig)
    assert colour_spread(np.array([[[10, 20, 40], [5, 5, 5]]], np.uint8)) == 15.0


def test_hook_sends_the_picture_to_the_visualizer(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp_path / 'work', max_epochs=2)
    cfg.custom_hooks.append(dict(type='MSTVisualizationHook', interval=2, num_images=1))
    runner = Runner.from_cfg(cfg)
    runner.train()
    logged = sorted(glob.glob(str(tmp_path / 'work' / '*' / 'vis_data' / 'vis_image' / '*.png')))
    assert [p.rsplit('_', 1)[-1] for p in logged] == ['2.png', '4.png']
