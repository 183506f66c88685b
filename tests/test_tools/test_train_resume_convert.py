"""A short ``tools/train.py`` run that saves, resumes and converts its checkpoint: the user's
path through every checkpoint load, in the fast tier, so that CI runs it on each stack it
tests (torch 2.13, numpy 2, torch 2.1)."""
import math

import torch

from mst_mm.engine import read_checkpoint
from tests.helpers import DEMO_CONFIG, load_tool, make_image_folder, scalars


def test_a_short_run_saves_resumes_and_converts_its_checkpoint(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4, size=(36, 40))
    work_dir = tmp_path / 'work'
    train = load_tool('tools/train.py')

    def run(epochs: int, *extra: str, work_dir=work_dir) -> None:
        train.main([DEMO_CONFIG, '--work-dir', str(work_dir), *extra, '--cfg-options',
                    f'train_dataloader.dataset.data_root={data_root}',
                    'train_dataloader.batch_size=4', 'train_dataloader.num_workers=0',
                    'train_dataloader.persistent_workers=False',
                    f'train_cfg.max_epochs={epochs}', 'default_hooks.checkpoint.interval=1',
                    'default_hooks.logger.interval=1', 'randomness.seed=0'])

    run(1)
    first = read_checkpoint(str(work_dir / 'epoch_1.pth'), map_location='cpu')
    assert first['meta']['epoch'] == 1 and first['meta']['iter'] == 2
    run(2, '--resume')  # from epoch_1.pth: mmengine's optimiser, schedulers and message hub
    resumed = read_checkpoint(str(work_dir / 'epoch_2.pth'), map_location='cpu')
    assert resumed['meta']['epoch'] == 2 and resumed['meta']['iter'] == 4
    assert resumed['optimizer']['state'], 'the optimiser state did not survive the resume'
    moved = [key for key, value in resumed['state_dict'].items()
             if value.is_floating_point() and not torch.equal(value, first['state_dict'][key])]
    assert any(key.startswith('backbone.') for key in moved)
    # The resumed run trained epoch 2 alone, as the uninterrupted run did: the same learning
    # rates (schedulers resumed) and losses (weights, optimiser moments and random streams;
    # up to float rounding, as both run in this one process: test_resume.py's are exact).
    run(2, work_dir=tmp_path / 'uninterrupted')
    logged = {name: {line['iter']: (line['lr'], line['loss']) for line in scalars(path)
                     if 'loss' in line}
              for name, path in [('resumed', work_dir), ('whole', tmp_path / 'uninterrupted')]}
    assert sorted(logged['resumed']) == [3, 4] and sorted(logged['whole']) == [1, 2, 3, 4]
    assert all(logged['resumed'][i][0] == logged['whole'][i][0]
               and math.isclose(logged['resumed'][i][1], logged['whole'][i][1], rel_tol=1e-6)
               for i in (3, 4)), logged

    out = tmp_path / 'backbone.pth'
    load_tool('tools/model_converters/mst2downstream.py').main(
        [str(work_dir / 'epoch_2.pth'), str(out), '--target', 'mmpretrain'])
    backbone = read_checkpoint(str(out), map_location='cpu')['state_dict']
    prefix = 'teacher.module.0.'
    teacher = {key[len(prefix):]: value for key, value in resumed['state_dict'].items()
               if key.startswith(prefix)}
    assert backbone.keys() == teacher.keys()
    assert all(torch.equal(backbone[key], teacher[key]) for key in teacher)
