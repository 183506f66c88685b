"""Pre-emption: a kill during a save keeps the previous checkpoints, ``--resume`` finds the
rolling ``latest.pth``, and a single-process run resumed at an epoch boundary logs what the
uninterrupted run logs, bit for bit (CPU, fixed seed, data loaded in the main process or by a
persistent worker that draws no randomness)."""
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from mmengine.runner import find_latest_checkpoint

import tests.fault_hooks  # noqa: F401  (registers the faults for the in-process runs)
from mst_mm.engine import check_training_checkpoint, read_checkpoint
from tests.helpers import DEMO_CONFIG, REPO, load_tool, make_image_folder, scalars

# 4 epochs of 4 iterations; epoch_N.pth every 2 epochs (the last one kept), latest.pth else.
EPOCHS, ITERS_PER_EPOCH = 4, 4
LOGGED = ('loss', 'loss_dino', 'loss_restore', 'lr', 'base_lr', 'teacher_temp', 'grad_norm',
          'wd', 'teacher_momentum')


def train_args(data_root, work_dir, *extra, epochs=EPOCHS, options=()) -> list:
    return [DEMO_CONFIG, '--work-dir', str(work_dir), *extra, '--cfg-options',
            f'train_dataloader.dataset.data_root={data_root}', 'train_dataloader.batch_size=4',
            'train_dataloader.num_workers=0', f'train_cfg.max_epochs={epochs}',
            'default_hooks.logger.interval=1', 'log_processor.window_size=1',
            'default_hooks.checkpoint.interval=2', 'default_hooks.checkpoint.max_keep_ckpts=1',
            'randomness.seed=3', *options]


def train(*args, **kwargs) -> None:
    """tools/train.py's main() in this process."""
    load_tool('tools/train.py').main(train_args(*args, **kwargs))


def train_in_fresh_process(args: list, expect_kill: bool = False) -> None:
    """tools/train.py in a new process. The runs compared bit for bit all start fresh: earlier
    tests leave state in this process (thread counts, compiled kernels) that moves float sums."""
    result = subprocess.run([sys.executable, str(REPO / 'tools' / 'train.py'), *args], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == (-signal.SIGKILL if expect_kill else 0), result.stderr[-3000:]


def logged_iterations(work_dir) -> dict:
    """{iteration: logged values} of the latest run in ``work_dir``."""
    return {line['iter']: {k: line[k] for k in LOGGED if k in line}
            for line in scalars(work_dir) if 'loss' in line}


def meta(path) -> dict:
    return read_checkpoint(str(path), map_location='cpu')['meta']


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> str:
    return make_image_folder(tmp_path_factory.mktemp('data'), classes=2, per_class=8)


@pytest.fixture(scope='module')
def reference(data_root, tmp_path_factory) -> dict:
    """The logged values of the uninterrupted run."""
    work_dir = tmp_path_factory.mktemp('reference')
    train_in_fresh_process(train_args(data_root, work_dir))
    logged = logged_iterations(work_dir)
    assert sorted(logged) == list(range(1, EPOCHS * ITERS_PER_EPOCH + 1))
    return logged


@pytest.fixture(scope='module')
def killed(data_root, tmp_path_factory):
    """The same run, killed (SIGKILL) half-way through writing epoch_4.pth; its work dir, and
    a copy of it as the kill left it."""
    work_dir = tmp_path_factory.mktemp('killed') / 'work'
    config = work_dir.parent / 'fault.py'  # custom_imports only act in a config file
    config.write_text(f'_base_ = [{DEMO_CONFIG!r}]\n'
                      "custom_imports = dict(imports=['mst_mm', 'tests.fault_hooks'])\n"
                      "default_hooks = dict(fault=dict(type='KillDuringSaveHook', epoch=4))\n")
    args = train_args(data_root, work_dir)
    args[0] = str(config)
    train_in_fresh_process(args, expect_kill=True)
    as_left = work_dir.parent / 'as_left'
    shutil.copytree(work_dir, as_left)
    return work_dir, as_left


@pytest.mark.slow
def test_a_kill_during_a_save_keeps_the_previous_checkpoints(killed):
    work_dir, as_left = killed
    assert (as_left / '.epoch_4.pth.partial').exists()     # the half-written bytes
    assert not (as_left / 'epoch_4.pth').exists()
    # max_keep_ckpts=1: mmengine's own hook deletes epoch_2.pth before writing epoch_4.pth.
    check_training_checkpoint(str(as_left / 'epoch_2.pth'))
    check_training_checkpoint(str(as_left / 'latest.pth'))
    assert meta(as_left / 'latest.pth')['epoch'] == 3
    assert meta(as_left / 'latest.pth')['iter'] == 3 * ITERS_PER_EPOCH
    # What mmengine's auto-resume (--resume alone) reads: the newer of the two.
    assert (as_left / 'last_checkpoint').read_text() == str(work_dir / 'latest.pth')
    assert find_latest_checkpoint(str(work_dir)) == str(work_dir / 'latest.pth')


@pytest.mark.slow
def test_the_killed_run_resumed_repeats_the_uninterrupted_run_bit_for_bit(killed, reference,
                                                                          data_root):
    work_dir, _ = killed
    train_in_fresh_process(train_args(data_root, work_dir, '--resume'))
    resumed = logged_iterations(work_dir)
    # Epoch 4 only: the centre, the EMA teacher, the optimiser, the schedules and the
    # random streams all came back from latest.pth.
    assert sorted(resumed) == list(range(3 * ITERS_PER_EPOCH + 1, EPOCHS * ITERS_PER_EPOCH + 1))
    for it in resumed:
        assert resumed[it] == reference[it], f'iteration {it} differs'
    assert {'loss_restore', 'teacher_temp', 'lr'} <= set(resumed[EPOCHS * ITERS_PER_EPOCH])
    # The kept checkpoint replaced latest.pth and the outdated epoch_2.pth.
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_4.pth']
    assert (work_dir / 'last_checkpoint').read_text() == str(work_dir / 'epoch_4.pth')


@pytest.mark.slow
def test_non_finite_loss_stops_before_the_update_and_the_last_checkpoint_resumes(data_root,
                                                                                 tmp_path):
    work_dir = tmp_path / 'work'
    options = ['default_hooks.checkpoint.interval=1',
               'default_hooks.fault.type=PoisonAtIterationHook', 'default_hooks.fault.iteration=7']
    with pytest.raises(FloatingPointError,
                       match=r'Non-finite MST loss at iteration 7 \(loss_dino=nan'):
        train(data_root, work_dir, epochs=2, options=options)
    assert (work_dir / 'epoch_1.pth').exists() and not (work_dir / 'epoch_2.pth').exists()
    state = read_checkpoint(str(work_dir / 'epoch_1.pth'))['state_dict']
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())

    train(data_root, work_dir, '--resume', epochs=2, options=options[:1])
    assert sorted(logged_iterations(work_dir)) == list(range(ITERS_PER_EPOCH + 1,
                                                             2 * ITERS_PER_EPOCH + 1))
    assert meta(work_dir / 'epoch_2.pth')['epoch'] == 2


@pytest.mark.slow
def test_a_resumed_run_with_persistent_workers_repeats_the_uninterrupted_run(data_root, tmp_path):
    # One persistent worker that only loads images: the views come from the data preprocessor.
    config = tmp_path / 'workers.py'
    config.write_text(f'_base_ = [{DEMO_CONFIG!r}]\n'
                      "model = dict(data_preprocessor=dict(multi_crop=dict(type='BatchMultiCrop',"
                      ' global_size=32, local_size=16, num_local_crops=4)))\n'
                      "train_dataloader = dict(dataset=dict(pipeline=[dict(type='LoadImageOrSkip'),"
                      " dict(type='PackInputs')]))\n")
    options = ['train_dataloader.num_workers=1', 'train_dataloader.persistent_workers=True',
               'default_hooks.checkpoint.max_keep_ckpts=2']  # keeps epoch_2.pth

    def run(name, *extra) -> dict:
        args = train_args(data_root, tmp_path / name, *extra, options=options)
        args[0] = str(config)
        train_in_fresh_process(args)
        return logged_iterations(tmp_path / name)

    uninterrupted = run('uninterrupted')
    resumed = run('resumed', '--resume', str(tmp_path / 'uninterrupted' / 'epoch_2.pth'))
    assert sorted(resumed) == list(range(2 * ITERS_PER_EPOCH + 1, EPOCHS * ITERS_PER_EPOCH + 1))
    for it in resumed:
        assert resumed[it] == uninterrupted[it], f'iteration {it} differs'
