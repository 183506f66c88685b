"""MST inside mmengine's Runner: schedules, teacher update, last-layer freeze, tools/train.py."""
import math
import subprocess
import sys

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from tests.helpers import DEMO_CONFIG, REPO, make_image_folder, scalars, tiny_runner_cfg


class Recorder(Hook):
    priority = 'LOWEST'  # after the schedule hooks have set this iteration's values

    def __init__(self):
        self.iters = []
        self.epoch_end_last_layer = []

    def before_train(self, runner):
        self.last_layer_start = self._last_layer(runner).clone()

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        groups = runner.optim_wrapper.optimizer.param_groups
        model = runner.model
        self.iters.append(dict(
            iter=runner.iter, epoch=runner.epoch,
            wd=sorted({g['weight_decay'] for g in groups}),
            teacher_temp=model.head.teacher_temp,
            freeze=bool(runner.optim_wrapper.frozen_params)))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.iters[-1]['losses'] = {k: float(v) for k, v in outputs.items()}
        if runner.iter == 0:
            self.teacher_after_first = {
                k: v.clone() for k, v in runner.model.teacher.avg_parameters.items()}

    def after_train_epoch(self, runner):
        self.epoch_end_last_layer.append(self._last_layer(runner).clone())

    @staticmethod
    def _last_layer(runner):
        # direction v and magnitude g (trained: norm_last_layer=False, as DINO's ViT-S)
        return torch.cat([p.detach().flatten() for p in runner.model.neck.last_layer.parameters()])


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('runner')
    data_root = make_image_folder(tmp / 'data', classes=2, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp / 'work', max_epochs=3, batch_size=4)
    runner = Runner.from_cfg(cfg)
    recorder = Recorder()
    runner.register_hook(recorder)
    runner.train()
    return runner, recorder


def test_losses_are_finite_and_move(trained):
    _, rec = trained
    dino = [it['losses']['loss_dino'] for it in rec.iters]
    restore = [it['losses']['loss_restore'] for it in rec.iters]
    assert len(dino) == 6
    assert all(math.isfinite(v) for v in dino + restore)
    assert len(set(dino)) > 1 and len(set(restore)) > 1


def test_weight_decay_schedule_keeps_zero_groups_at_zero(trained):
    _, rec = trained
    total = len(rec.iters)
    for it in rec.iters:
        expected = 0.4 + (0.04 - 0.4) * (1 + math.cos(math.pi * it['iter'] / total)) / 2
        assert it['wd'][0] == 0.0  # biases, norms and the mask token
        assert it['wd'][1] == pytest.approx(expected, rel=1e-6)
        assert len(it['wd']) == 2


def test_teacher_temperature_warms_up_per_epoch(trained):
    _, rec = trained
    by_epoch = {it['epoch']: it['teacher_temp'] for it in rec.iters}
    assert by_epoch == pytest.approx({0: 0.04, 1: 0.07, 2: 0.07})


def test_last_layer_is_frozen_in_the_first_epoch_only(trained):
    _, rec = trained
    assert [it['freeze'] for it in rec.iters] == [True] * 2 + [False] * 4
    torch.testing.assert_close(rec.epoch_end_last_layer[0], rec.last_layer_start)
    assert not torch.equal(rec.epoch_end_last_layer[1], rec.epoch_end_last_layer[0])


def test_teacher_changes_during_training(trained):
    runner, rec = trained
    final = runner.model.teacher.avg_parameters
    moved = [k for k, v in rec.teacher_after_first.items() if not torch.equal(v, final[k])]
    assert len(moved) > len(final) // 2


def train_cli(data_root, work_dir, *extra, max_epochs=2):
    cmd = [sys.executable, str(REPO / 'tools' / 'train.py'), DEMO_CONFIG,
           '--work-dir', str(work_dir), *extra, '--cfg-options',
           f'train_dataloader.dataset.data_root={data_root}',
           'train_dataloader.batch_size=4', 'train_dataloader.num_workers=0',
           'train_dataloader.persistent_workers=False', f'train_cfg.max_epochs={max_epochs}',
           'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=1']
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_tools_train_py_end_to_end(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4)
    work_dir = tmp_path / 'work'
    result = train_cli(data_root, work_dir)
    logged = [s for s in scalars(work_dir) if 'loss_dino' in s]
    assert len(logged) == 4
    for key in ('loss', 'loss_dino', 'loss_restore'):
        values = [s[key] for s in logged]
        assert all(math.isfinite(v) for v in values) and len(set(values)) > 1
    assert (work_dir / 'epoch_2.pth').exists()
    assert 'eta' in result.stdout + result.stderr
    # Resuming (auto, weights-only) is tests/test_engine/test_resume.py's.
