"""visualize_mst.py writes the picture rows; the hook logs them during training."""
import glob

import mmcv
import numpy as np
import torch
from mmengine.config import Config
from mmengine.runner import Runner
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.visualization import mst_picture_row
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
    images = sorted(glob.glob(make_image_folder(tmp_path / 'img', classes=1, per_class=2)
                              + '/*/*.png'))
    tool = load_tool('tools/analysis/visualize_mst.py')
    written = tool.main([DEMO_CONFIG, str(ckpt), *images, '--out', str(tmp_path / 'out'),
                         '--grid'])
    assert len(written) == 3
    for path in written:
        picture = mmcv.imread(path)
        assert picture is not None and picture.shape[0] > 50 and picture.shape[1] > 300
    grid = mmcv.imread(written[-1])
    assert grid.shape[0] > mmcv.imread(written[0]).shape[0]  # two rows are taller than one


def test_hook_sends_the_picture_to_the_visualizer(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp_path / 'work', max_epochs=2)
    cfg.custom_hooks.append(dict(type='MSTVisualizationHook', interval=2, num_images=1))
    runner = Runner.from_cfg(cfg)
    runner.train()
    logged = sorted(glob.glob(str(tmp_path / 'work' / '*' / 'vis_data' / 'vis_image' / '*.png')))
    assert [p.rsplit('_', 1)[-1] for p in logged] == ['2.png', '4.png']
