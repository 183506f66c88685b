"""tools/dist_train.sh with 2 processes (torchrun, gloo, CPU): the config trains under DDP."""
import os
import socket
import subprocess
import sys
import time

import torch

from tests.helpers import DEMO_CONFIG, REPO, make_image_folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def dist_train_two_processes(tmp_path, hook_module: str, extra: str, **run_kwargs):
    """tools/dist_train.sh with 2 gloo processes on the demo config and a tiny folder."""
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=8)
    config = tmp_path / 'ddp.py'
    config.write_text(
        f'_base_ = [{DEMO_CONFIG!r}]\n'
        f"custom_imports = dict(imports=['mst_mm', {hook_module!r}],\n"
        '                      allow_failed_imports=False)\n'
        f'train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,\n'
        f'                        dataset=dict(data_root={data_root!r}))\n'
        'train_cfg = dict(max_epochs=2)\n' + extra)
    # tools/dist_train.sh runs `python -m torch.distributed.run`: put this interpreter first.
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1', PORT=str(free_port()),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    cmd = ['bash', str(REPO / 'tools' / 'dist_train.sh'), str(config), '2',
           '--work-dir', str(tmp_path / 'work')]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, **run_kwargs), config


def test_two_process_ddp_keeps_teacher_and_centre_identical(tmp_path):
    result, _ = dist_train_two_processes(
        tmp_path, 'tests.ddp_probe_hook',
        "custom_hooks = [dict(type='TeacherTempWarmupHook', warmup_epochs=2),\n"
        "                dict(type='FreezeLastLayerHook', freeze_epochs=1),\n"
        "                dict(type='DDPProbeHook')]\n"
        "default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))\n")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    work_dir = tmp_path / 'work'

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
