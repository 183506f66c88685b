"""Pre-emption: a run killed after a checkpoint and resumed logs exactly what an
uninterrupted run logs, bit for bit on CPU with a fixed seed."""
import os
import signal
import subprocess
import sys
from functools import partial

import numpy as np
import torch
from mmengine.dataset import worker_init_fn as default_worker_init_fn

from mst_mm.datasets import worker_init_from_torch_seed
from tests.helpers import DEMO_CONFIG, REPO, make_image_folder

# 4 epochs of 4 iterations, a checkpoint every 2 epochs; the killed run dies in epoch 3.
EPOCHS, ITERS_PER_EPOCH, KILL_AT = 4, 4, 11
LOGGED = ('loss', 'loss_dino', 'loss_restore', 'lr', 'base_lr', 'teacher_temp', 'grad_norm')


def train(data_root, work_dir, *extra, kill_at=None):
    config = DEMO_CONFIG
    if kill_at is not None:  # custom_imports only act in a config file
        config = str(work_dir) + '_kill.py'
        with open(config, 'w') as f:
            f.write(f'_base_ = [{DEMO_CONFIG!r}]\n'
                    "custom_imports = dict(imports=['mst_mm', 'tests.kill_hook'],\n"
                    '                      allow_failed_imports=False)\n'
                    'default_hooks = dict(kill=dict(type="KillAtIterationHook", '
                    f'iteration={kill_at}))\n')
    options = [f'train_dataloader.dataset.data_root={data_root}',
               'train_dataloader.batch_size=4', 'train_dataloader.num_workers=2',
               f'train_cfg.max_epochs={EPOCHS}', 'default_hooks.logger.interval=1',
               'log_processor.window_size=1', 'default_hooks.checkpoint.interval=2',
               'default_hooks.checkpoint.max_keep_ckpts=3', 'randomness.seed=3']
    cmd = [sys.executable, str(REPO / 'tools' / 'train.py'), config,
           '--work-dir', str(work_dir), *extra, '--cfg-options', *options]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def logged_iterations(work_dir) -> dict:
    import glob
    import json
    lines = []
    for path in sorted(glob.glob(str(work_dir / '*' / 'vis_data' / 'scalars.json'))):
        with open(path) as f:
            lines += [json.loads(line) for line in f if line.strip()]
    return {line['iter']: {k: line[k] for k in LOGGED if k in line}
            for line in lines if 'loss' in line}


def test_killed_and_resumed_run_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8, size=(40, 48))
    straight = train(data_root, tmp_path / 'straight')
    assert straight.returncode == 0, straight.stderr[-3000:]
    reference = logged_iterations(tmp_path / 'straight')
    assert sorted(reference) == list(range(1, EPOCHS * ITERS_PER_EPOCH + 1))

    killed = train(data_root, tmp_path / 'killed', kill_at=KILL_AT)
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


class _NumpyDraws(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return np.random.randint(0, 2**31)


def _epoch_draws(worker_init_fn) -> list:
    loader = torch.utils.data.DataLoader(_NumpyDraws(), batch_size=2, num_workers=2,
                                         worker_init_fn=worker_init_fn)
    return [int(x) for batch in loader for x in batch]


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
