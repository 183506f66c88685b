"""tools/dist_train.sh and tools/slurm_train.sh with 2 processes (gloo, CPU): the config
trains under DDP, the ranks draw different random numbers and keep identical weights."""
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import pytest
import torch

from tests.helpers import DEMO_CONFIG, REPO, make_image_folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def dist_train_two_processes(tmp_path, hook_modules: Union[str, Sequence[str]], extra: str,
                             data_root: Optional[str] = None,
                             num_workers: int = 0, slurm: bool = False, **run_kwargs):
    """tools/dist_train.sh (or, with ``slurm``, tools/slurm_train.sh through the fake srun
    and scontrol of tests/fake_slurm) with 2 gloo processes on the demo config and a tiny
    folder, wrapped in tests/cpu_distributed.py's DDP for CPU models.

    Args:
        tmp_path (Path): Holds the config, the work dir ``work`` and, unless ``data_root``
            is given, the images.
        hook_modules (str | Sequence[str]): Modules for ``custom_imports`` besides mst_mm.
        extra (str): Config lines appended to the generated config.
        data_root (str, optional): An image folder to train on instead of a new one.
        num_workers (int): Data-loader workers per rank.
        **run_kwargs: Passed to ``subprocess.run``.
    """
    modules = ['mst_mm', *([hook_modules] if isinstance(hook_modules, str) else hook_modules)]
    data_root = data_root or make_image_folder(tmp_path / 'data', classes=2, per_class=8)
    config = tmp_path / 'ddp.py'
    config.write_text(
        f'_base_ = [{DEMO_CONFIG!r}]\n'
        f'custom_imports = dict(imports={modules!r}, allow_failed_imports=False)\n'
        f'train_dataloader = dict(batch_size=4, num_workers={num_workers},\n'
        f'                        persistent_workers=False,\n'
        f'                        dataset=dict(data_root={str(data_root)!r}))\n'
        'train_cfg = dict(max_epochs=2)\n'
        # mmengine's default wrapper's settings, with a wrapper that also takes a CPU model.
        "model_wrapper_cfg = dict(type='tests.cpu_distributed.DeviceAgnosticDDP',\n"
        '                         broadcast_buffers=False, find_unused_parameters=False)\n'
        + extra)
    # tools/dist_train.sh runs `python -m torch.distributed.run`: put this interpreter first.
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1', PORT=str(free_port()),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    cmd = ['bash', str(REPO / 'tools' / 'dist_train.sh'), str(config), '2']
    if slurm:
        env.update(GPUS='2', GPUS_PER_NODE='2', MASTER_PORT=env.pop('PORT'),
                   PATH=str(REPO / 'tests' / 'fake_slurm') + os.pathsep + env['PATH'])
        cmd = ['bash', str(REPO / 'tools' / 'slurm_train.sh'), 'cpu', 'mst-test', str(config),
               str(tmp_path / 'work')]
    else:
        cmd += ['--work-dir', str(tmp_path / 'work')]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, **run_kwargs), config


def assert_ranks_agree(work_dir) -> None:
    """The DDPProbeHook dumps of both ranks hold bit-identical centre, teacher and student."""
    ranks = [torch.load(work_dir / f'probe_rank{r}.pth', weights_only=True) for r in (0, 1)]
    for probe in ranks:
        assert probe['wrapper'] == 'DeviceAgnosticDDP' and probe['world_size'] == 2
        assert probe['sync_bn'] > 0 and probe['plain_bn'] == 0
    torch.testing.assert_close(ranks[0]['center'], ranks[1]['center'], rtol=0, atol=0)
    assert ranks[0]['center'].abs().sum() > 0
    for key in ranks[0]['teacher']:
        torch.testing.assert_close(ranks[0]['teacher'][key], ranks[1]['teacher'][key],
                                   rtol=0, atol=0, msg=key)
    for key in ranks[0]['student']:
        torch.testing.assert_close(ranks[0]['student'][key], ranks[1]['student'][key],
                                   rtol=0, atol=0, msg=key)


def one_image_folder(root: Path) -> str:
    """16 copies of one image in 2 classes: the ranks' crops can differ only by randomness."""
    source = Path(make_image_folder(root / 'source', classes=1, per_class=1)) / 'class_0'
    for c in range(2):
        folder = root / 'images' / f'class_{c}'
        folder.mkdir(parents=True)
        for i in range(8):
            shutil.copy(source / '0.png', folder / f'{i}.png')
    return str(root / 'images')


@pytest.mark.slow
@pytest.mark.parametrize('slurm', [False, True], ids=['dist_train.sh', 'slurm_train.sh'])
def test_two_process_ddp_draws_differently_per_rank_and_keeps_identical_weights(tmp_path,
                                                                               slurm):
    result, _ = dist_train_two_processes(
        tmp_path, 'tests.ddp_probe_hook',
        "custom_hooks = [dict(type='TeacherTempWarmupHook', warmup_epochs=2),\n"
        "                dict(type='FreezeLastLayerHook', freeze_epochs=1),\n"
        "                dict(type='DDPProbeHook'), dict(type='RandomnessProbeHook')]\n"
        "default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))\n"
        # Random masks hang on the generator alone, not also on the crops via the attention.
        "model = dict(mask_cfg=dict(mode='random'))\n",
        data_root=one_image_folder(tmp_path / 'data'), num_workers=1,  # a worker's seeding
        slurm=slurm)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    work_dir = tmp_path / 'work'
    assert_ranks_agree(work_dir)
    # DINO's freeze under DDP without find_unused_parameters: the last layer's gradient
    # flows (DDP reduces it) and is cancelled before the update, in epoch 1 only.
    for rank in (0, 1):
        probe = torch.load(work_dir / f'probe_rank{rank}.pth', weights_only=True)
        assert probe['find_unused_parameters'] is False
        start, after_epoch_1, after_epoch_2 = probe['last_layer']
        assert torch.equal(after_epoch_1, start)
        assert not torch.equal(after_epoch_2, after_epoch_1)

    # randomness.diff_rank_seed: the same image, different crops, masks and generators.
    ranks = [torch.load(work_dir / f'randomness_rank{r}.pth', weights_only=True)
             for r in (0, 1)]
    assert len(ranks[0]['crops']) == 2 + 4 and len(ranks[0]['masks']) == 1
    for view, (crops_0, crops_1) in enumerate(zip(ranks[0]['crops'], ranks[1]['crops'])):
        assert not torch.equal(crops_0, crops_1), f'view {view}: the same crops on both ranks'
    assert ranks[0]['masks'][0].any()
    assert not torch.equal(ranks[0]['masks'][0], ranks[1]['masks'][0])
    assert not torch.equal(ranks[0]['torch'], ranks[1]['torch'])   # drop-path's generator
    assert not torch.equal(ranks[0]['numpy'], ranks[1]['numpy'])


@pytest.mark.slow
def test_an_exception_on_one_rank_ends_both_processes(tmp_path):
    start = time.monotonic()
    # Rank 0 waits in the next all-reduce; the launcher must end it, not the 600 s timeout.
    result, config = dist_train_two_processes(
        tmp_path, 'tests.fault_hooks',
        "default_hooks = dict(logger=dict(interval=1),\n"
        "                     fault=dict(type='RaiseOnRankHook', iteration=3, rank=1))\n",
        start_new_session=True)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert 'injected fault on rank 1' in result.stdout + result.stderr
    assert elapsed < 180, f'took {elapsed:.0f} s'
    leftover = subprocess.run(['pgrep', '-f', str(config)], capture_output=True, text=True)
    assert leftover.stdout.strip() == '', 'a rank outlived the failure'


def test_run_tool_frees_reference_cycles_before_it_destroys_the_process_group():
    """A runner lives in reference cycles, and its DDP reducer holds the gloo group; run_tool
    frees them before destroying the group, not in the interpreter's teardown (where gloo can
    abort a finished run). Automatic collection is off, so only run_tool can free the cycle."""
    script = f'''
import gc, weakref
import torch
import torch.distributed as dist
from mst_mm.utils.cli import run_tool
gc.disable()
dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0,
                        world_size=1)
refs, destroy = [], dist.destroy_process_group
def checked_destroy():
    print('model alive at destroy:', refs[0]() is not None)
    destroy()
dist.destroy_process_group = checked_destroy
def main():
    class Runner:
        pass
    runner = Runner()
    runner.me = runner
    runner.model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    refs.append(weakref.ref(runner.model))
run_tool(main)
print('group left:', dist.is_initialized())
'''
    result = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True,
                            text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1'))
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'model alive at destroy: False' in result.stdout, result.stdout
    assert 'group left: False' in result.stdout, result.stdout
