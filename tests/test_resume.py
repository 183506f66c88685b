"""Pre-emption: a run killed after a checkpoint and resumed logs exactly what an
uninterrupted run logs, bit for bit on CPU with a fixed seed."""
import json
import os
import random
import signal
import subprocess
import sys
from functools import partial

import numpy as np
import torch
from mmengine.dataset import worker_init_fn as default_worker_init_fn

from mst_mm.datasets import worker_init, worker_init_from_torch_seed
from mst_mm.datasets.worker_init import worker_seed
from mst_mm.engine import load_local_checkpoint, read_checkpoint
from tests.helpers import DEMO_CONFIG, REPO, make_image_folder, scalars

# 4 epochs of 4 iterations, a checkpoint every 2 epochs; the killed run dies in epoch 3.
EPOCHS, ITERS_PER_EPOCH, KILL_AT = 4, 4, 11
LOGGED = ('loss', 'loss_dino', 'loss_restore', 'lr', 'base_lr', 'teacher_temp', 'grad_norm',
          'wd', 'teacher_momentum')


def train(data_root, work_dir, *extra, fault=None, at=None, checkpoint_interval=2,
          keep=3, epochs=EPOCHS, probe_order=False, options=()):
    config = DEMO_CONFIG
    if fault is not None or probe_order:  # custom_imports only act in a config file
        config = str(work_dir) + '_fault.py'
        hooks = dict(fault=dict(type=fault, iteration=at)) if fault else {}
        if probe_order:
            hooks['order'] = dict(type='BatchOrderProbeHook')
        with open(config, 'w') as f:
            f.write(f'_base_ = [{DEMO_CONFIG!r}]\n'
                    "custom_imports = dict(imports=['mst_mm', 'tests.fault_hooks',\n"
                    "                               'tests.order_probe_hooks'],\n"
                    '                      allow_failed_imports=False)\n'
                    f'default_hooks = {hooks!r}\n')
    options = [*options, f'train_dataloader.dataset.data_root={data_root}',
               'train_dataloader.batch_size=4', 'train_dataloader.num_workers=2',
               f'train_cfg.max_epochs={epochs}', 'default_hooks.logger.interval=1',
               'log_processor.window_size=1',
               f'default_hooks.checkpoint.interval={checkpoint_interval}',
               f'default_hooks.checkpoint.max_keep_ckpts={keep}', 'randomness.seed=3']
    cmd = [sys.executable, str(REPO / 'tools' / 'train.py'), str(config),
           '--work-dir', str(work_dir), *extra, '--cfg-options', *options]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def logged_iterations(work_dir) -> dict:
    return {line['iter']: {k: line[k] for k in LOGGED if k in line}
            for line in scalars(work_dir, all_runs=True) if 'loss' in line}


def test_killed_and_resumed_run_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(40, 48))
    straight = train(data_root, tmp_path / 'straight')
    assert straight.returncode == 0, straight.stderr[-3000:]
    reference = logged_iterations(tmp_path / 'straight')
    assert sorted(reference) == list(range(1, EPOCHS * ITERS_PER_EPOCH + 1))

    killed = train(data_root, tmp_path / 'killed', fault='KillAtIterationHook', at=KILL_AT)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (tmp_path / 'killed' / 'epoch_2.pth').exists()
    assert not (tmp_path / 'killed' / 'epoch_4.pth').exists()
    resumed = train(data_root, tmp_path / 'killed', '--resume')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed epoch: 2' in resumed.stdout + resumed.stderr

    second_half = logged_iterations(tmp_path / 'killed')
    for it in range(2 * ITERS_PER_EPOCH + 1, EPOCHS * ITERS_PER_EPOCH + 1):
        assert second_half[it] == reference[it], f'iteration {it} differs'
    assert {'loss_restore', 'teacher_temp', 'lr'} <= set(reference[16])


def test_non_finite_loss_stops_before_the_update_and_the_last_checkpoint_resumes(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(40, 48))
    work_dir = tmp_path / 'work'
    poisoned = train(data_root, work_dir, fault='PoisonAtIterationHook', at=7,
                     checkpoint_interval=1)
    assert poisoned.returncode != 0
    assert 'Non-finite MST loss at iteration 7 (loss_dino=nan' in poisoned.stderr
    assert (work_dir / 'epoch_1.pth').exists() and not (work_dir / 'epoch_2.pth').exists()
    state = read_checkpoint(str(work_dir / 'epoch_1.pth'))['state_dict']
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())

    resumed = train(data_root, work_dir, '--resume', checkpoint_interval=1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed epoch: 1' in resumed.stdout + resumed.stderr
    assert (work_dir / f'epoch_{EPOCHS}.pth').exists()


def test_a_kill_during_a_save_keeps_the_previous_checkpoint_and_pointer(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(40, 48))
    work_dir = tmp_path / 'work'
    # max_keep_ckpts=1: mmengine's own hook deletes epoch_1.pth before writing epoch_2.pth.
    killed = train(data_root, work_dir, fault='KillDuringSaveHook', at=2, checkpoint_interval=1,
                   keep=1, epochs=3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (work_dir / '.epoch_2.pth.partial').exists()       # the half-written bytes
    assert not (work_dir / 'epoch_2.pth').exists()
    assert (work_dir / 'last_checkpoint').read_text() == 'epoch_1.pth'  # relative to the work dir
    read_checkpoint(str(work_dir / 'epoch_1.pth'))     # intact

    resumed = train(data_root, work_dir, '--resume', checkpoint_interval=1, keep=1, epochs=3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed epoch: 1' in resumed.stdout + resumed.stderr
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_3.pth']
    assert (work_dir / 'last_checkpoint').read_text() == 'epoch_3.pth'


def _meta(path) -> dict:
    return load_local_checkpoint(str(path), map_location='cpu')['meta']


def _pth_names(work_dir) -> list:
    return sorted(p.name for p in work_dir.glob('*.pth*'))


def test_a_kill_after_epoch_k_resumes_from_the_rolling_checkpoint_of_epoch_k(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(40, 48))
    work_dir = tmp_path / 'work'
    # Kept checkpoints every 10 epochs (none before the kill); the rolling one every epoch.
    # 4 iterations an epoch: iteration 11 lies in epoch 3, after epochs 1 and 2 ended.
    killed = train(data_root, work_dir, fault='KillAtIterationHook', at=11,
                   checkpoint_interval=10, epochs=3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert _pth_names(work_dir) == ['latest.pth']
    assert (work_dir / 'last_checkpoint').read_text() == 'latest.pth'
    assert _meta(work_dir / 'latest.pth')['epoch'] == 2
    assert _meta(work_dir / 'latest.pth')['iter'] == 2 * ITERS_PER_EPOCH

    resumed = train(data_root, work_dir, '--resume', checkpoint_interval=10, epochs=3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed epoch: 2' in resumed.stdout + resumed.stderr
    assert sorted(line['iter'] for line in scalars(work_dir) if 'loss' in line) == \
        list(range(2 * ITERS_PER_EPOCH + 1, 3 * ITERS_PER_EPOCH + 1))
    # The last epoch is kept (save_last); the rolling checkpoint, now older, is gone.
    assert _pth_names(work_dir) == ['epoch_3.pth']
    assert (work_dir / 'last_checkpoint').read_text() == 'epoch_3.pth'


def test_a_rolling_checkpoint_by_iterations_resumes_in_the_middle_of_the_epoch(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(40, 48))
    rolling = ['train_cfg.type=MidEpochResumeTrainLoop',
               'default_hooks.checkpoint.latest_by_epoch=False',
               'default_hooks.checkpoint.latest_interval=3']
    straight = train(data_root, tmp_path / 'straight', probe_order=True, options=rolling,
                     checkpoint_interval=10, epochs=2)
    assert straight.returncode == 0, straight.stderr[-3000:]
    # Rolling saves after iterations 3 and 6; the kill comes in iteration 7 (epoch 2,
    # batch 3 of 4), before anything saves it.
    work_dir = tmp_path / 'killed'
    killed = train(data_root, work_dir, fault='KillAtIterationHook', at=7, probe_order=True,
                   options=rolling, checkpoint_interval=10, epochs=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    meta = _meta(work_dir / 'latest.pth')
    assert (meta['epoch'], meta['iter']) == (1, 6)  # in epoch 2 (index 1), 6 iterations done
    resumed = train(data_root, work_dir, '--resume', probe_order=True, options=rolling,
                    checkpoint_interval=10, epochs=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'Resuming in the middle of epoch 2: 2 of its 4 batches' in resumed.stdout

    def order(folder):
        lines = [json.loads(line) for line in (folder / 'batch_order.jsonl').open()]
        return {line['iter']: (line['batch_idx'], line['samples']) for line in lines}

    expected, got = order(tmp_path / 'straight'), order(work_dir)
    assert sorted(got) == list(range(1, 9))  # up to the kill, then after the resume
    for it in (7, 8):  # after the resume: the same batches at the same places
        assert got[it] == expected[it], f'iteration {it}'
    reference = logged_iterations(tmp_path / 'straight')
    after = {line['iter']: line for line in scalars(work_dir) if 'loss' in line}
    assert sorted(after) == [7, 8]  # only the two batches that were left
    for it in (7, 8):  # the iteration-based schedules continue where they stopped
        assert after[it]['lr'] == reference[it]['lr']
        assert after[it]['wd'] == reference[it]['wd']
    assert _meta(work_dir / 'epoch_2.pth')['iter'] == 8


def test_a_rolling_checkpoint_by_iterations_needs_a_loop_that_resumes_mid_epoch(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4, size=(40, 48))
    result = train(data_root, tmp_path / 'work', epochs=1, options=[
        'train_cfg.type=EpochBasedTrainLoop', 'default_hooks.checkpoint.latest_by_epoch=False'])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Set train_cfg.type='MidEpochResumeTrainLoop'" in result.stderr
    assert 'Epoch(train)' not in result.stdout + result.stderr


class _NumpyDraws(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return np.random.randint(0, 2**31)


class _AllDraws(_NumpyDraws):
    def __getitem__(self, index):
        return (np.random.randint(0, 2**31), random.randrange(2**31),
                int(torch.randint(0, 2**31, ())))


def _epoch_draws(worker_init_fn) -> list:
    loader = torch.utils.data.DataLoader(_NumpyDraws(), batch_size=2, num_workers=2,
                                         worker_init_fn=worker_init_fn)
    return [int(x) for batch in loader for x in batch]


def _rank_epoch_draws(monkeypatch, rank: int, init=worker_init_from_torch_seed) -> list:
    """Per sample, the (numpy, random, torch) draws of an epoch's workers on `rank`."""
    monkeypatch.setattr(worker_init, '_current_rank', lambda: rank)  # forked workers see it
    loader = torch.utils.data.DataLoader(_AllDraws(), batch_size=None, num_workers=2,
                                         worker_init_fn=init)
    return [tuple(int(x) for x in sample) for sample in loader]


def test_worker_seeding_differs_every_epoch_and_follows_torchs_generator():
    torch.manual_seed(0)
    epoch_1, epoch_2 = _epoch_draws(worker_init_from_torch_seed), _epoch_draws(
        worker_init_from_torch_seed)
    assert epoch_1 != epoch_2
    torch.manual_seed(0)                      # what RandomStateHook restores
    assert _epoch_draws(worker_init_from_torch_seed) == epoch_1
    # mmengine's default seeds every epoch's workers alike: the same draws each epoch.
    default = partial(default_worker_init_fn, num_workers=2, rank=0, seed=0)
    assert _epoch_draws(default) == _epoch_draws(default)


def test_worker_seeding_folds_the_rank_into_every_generator(monkeypatch):
    torch.manual_seed(0)                # every rank's main generator, before RandomStateHook
    rank_0, rank_0_next = _rank_epoch_draws(monkeypatch, 0), _rank_epoch_draws(monkeypatch, 0)
    torch.manual_seed(0)
    rank_1, rank_1_next = _rank_epoch_draws(monkeypatch, 1), _rank_epoch_draws(monkeypatch, 1)
    for generator in range(3):          # numpy, random and torch: none is shared by the ranks
        assert {s[generator] for s in rank_0}.isdisjoint(s[generator] for s in rank_1)
    assert rank_1 != rank_1_next        # still a new stream every epoch
    torch.manual_seed(0)                # what RandomStateHook restores: the same again
    assert _rank_epoch_draws(monkeypatch, 1) == rank_1

    # Rank 0 (a single-process run) keeps the seeds it had before ranks were folded in.
    def rank_blind(worker_id):
        np.random.seed(torch.initial_seed() % 2**32)
        random.seed(torch.initial_seed() % 2**32)

    torch.manual_seed(0)
    assert rank_0 == _rank_epoch_draws(monkeypatch, 0, init=rank_blind)
    assert rank_0 != rank_0_next
    assert worker_seed(7, 0) == 7
    assert len({worker_seed(7, 1), worker_seed(7, 2), worker_seed(8, 1)}) == 3
