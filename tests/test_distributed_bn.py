"""CPUSyncBatchNorm over 2 gloo ranks equals BatchNorm over the whole batch."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from mst_mm.engine import CPUSyncBatchNorm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _rank_step(rank, port, x, out_dir):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=2)
    torch.manual_seed(0)
    bn = nn.SyncBatchNorm(3)
    bn.__class__ = CPUSyncBatchNorm
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    part = x.chunk(2)[rank].clone().requires_grad_(True)
    y = bn(part)
    (y * torch.arange(y.numel()).reshape(y.shape).float()).sum().backward()
    torch.save(dict(y=y.detach(), grad=part.grad, mean=bn.running_mean, var=bn.running_var,
                    wgrad=bn.weight.grad), os.path.join(out_dir, f'{rank}.pt'))
    dist.destroy_process_group()


def test_two_rank_statistics_and_gradients_match_one_big_batch(tmp_path):
    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    mp.spawn(_rank_step, args=(_free_port(), x, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f'{r}.pt', weights_only=True) for r in (0, 1)]

    torch.manual_seed(0)
    ref = nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    full = x.clone().requires_grad_(True)
    y = ref(full)
    halves = [torch.arange(h.numel()).reshape(h.shape).float() for h in y.detach().chunk(2)]
    (y * torch.cat(halves)).sum().backward()

    torch.testing.assert_close(torch.cat([r['y'] for r in ranks]), y.detach())
    torch.testing.assert_close(torch.cat([r['grad'] for r in ranks]), full.grad)
    # DDP averages parameter gradients over ranks; the sum of rank gradients is the full one.
    torch.testing.assert_close(ranks[0]['wgrad'] + ranks[1]['wgrad'], ref.weight.grad)
    for r in ranks:
        torch.testing.assert_close(r['mean'], ref.running_mean)
        torch.testing.assert_close(r['var'], ref.running_var)
