"""A short ``tools/train.py`` run that saves, resumes and converts its checkpoint: the user's
path through every checkpoint load, in the fast tier, so that CI runs it on each stack it
tests (torch 2.13, numpy 2, torch 2.1)."""
import torch

from mst_mm.engine import read_checkpoint
from tests.helpers import DEMO_CONFIG, load_tool, make_image_folder


def test_a_short_run_saves_resumes_and_converts_its_checkpoint(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4, size=(36, 40))
    work_dir = tmp_path / 'work'
    train = load_tool('tools/train.py')

    def run(epochs: int, *extra: str) -> None:
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

    out = tmp_path / 'backbone.pth'
    load_tool('tools/model_converters/mst2downstream.py').main(
        [str(work_dir / 'epoch_2.pth'), str(out), '--target', 'mmpretrain'])
    backbone = read_checkpoint(str(out), map_location='cpu')['state_dict']
    prefix = 'teacher.module.0.'
    teacher = {key[len(prefix):]: value for key, value in resumed['state_dict'].items()
               if key.startswith(prefix)}
    assert backbone.keys() == teacher.keys()
    assert all(torch.equal(backbone[key], teacher[key]) for key in teacher)
