"""tools/demo.py end to end on a small image folder: table rows, seeds, pictures."""
import json
import os

from mmengine.config import Config

from tests.helpers import load_tool, make_image_folder


def test_demo_runs_every_row_for_every_seed(tmp_path, capsys):
    data_root = tmp_path / 'own_images'
    make_image_folder(data_root / 'train', classes=2, per_class=4, size=(32, 32), seed=0)
    make_image_folder(data_root / 'val', classes=2, per_class=2, size=(32, 32), seed=1)
    demo = load_tool('tools/demo.py')
    work_dir = tmp_path / 'work'
    results = demo.main(['--seeds', '2', '--epochs', '1', '--batch-size', '4',
                         '--data-root', str(data_root), '--work-dir', str(work_dir)])

    rows = ['raw pixels', 'random init'] + [row for _, row, _ in demo.VARIANTS]
    assert list(results) == rows
    diagnostics = {'loss_dino', 'teacher_entropy', 'teacher_student_kl'}
    for row, values in results.items():
        pretrained = row not in ('raw pixels', 'random init')
        assert set(values) == set(demo.KS) | (diagnostics if pretrained else set())
        assert all(len(v) == (1 if row == 'raw pixels' else 2) for v in values.values())
        assert all(0 <= acc <= 100 for k in demo.KS for acc in values[k])
        if pretrained:   # the table's diagnostics are the runs' last logged values
            assert all(v > 0 for key in diagnostics for v in values[key])
    saved = json.loads((work_dir / 'knn_table.json').read_text())
    assert list(saved) == rows
    assert os.path.isfile(work_dir / 'pictures' / 'mst_pictures.png')
    assert os.path.getsize(work_dir / 'pictures' / 'dino_curves.png') > 10_000
    # Each row trained what it says: the dumped configs of the runs.
    config_name = 'mst_vit-tiny-p4_1xb64-coslr-10e_demo.py'
    dumped = {name: Config.fromfile(str(work_dir / 'seed0' / name / config_name))
              for name, _, _ in demo.VARIANTS}
    assert dumped['dino'].model.decoder_head is None
    assert dumped['dino'].model.mask_cfg.mode == 'none'
    assert dumped['mst_random_mask'].model.mask_cfg.mode == 'random'
    assert dumped['mst_mask_none'].model.mask_cfg.mode == 'none'
    assert dumped['mst_mask_none'].model.decoder_head.type == 'ImageDecoderHead'
    assert dumped['mst'].model.mask_cfg.mode == 'attention'
    assert dumped['mst'].model.decoder_head.type == 'ImageDecoderHead'
    out = capsys.readouterr().out
    assert 'mean ± std over 2 seeds' in out and '| raw pixels |' in out
    assert '| features | k = 10 | k = 20 | loss_dino | H(P_t) | KL |' in out
