"""CPUSyncBatchNorm over 2 gloo ranks equals BatchNorm over the whole batch."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from tests.cpu_distributed import CPUSyncBatchNorm


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


def _two_ranks_and_one_big_batch(x, tmp_path, ref_dtype=torch.float32):
    """CPUSyncBatchNorm over two ranks, and BatchNorm2d over the whole of ``x``."""
    mp.spawn(_rank_step, args=(_free_port(), x, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f'{r}.pt', weights_only=True) for r in (0, 1)]

    torch.manual_seed(0)
    ref = nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    ref.to(ref_dtype)
    full = x.to(ref_dtype).requires_grad_(True)
    y = ref(full)
    halves = [torch.arange(h.numel()).reshape(h.shape) for h in y.detach().chunk(2)]
    (y * torch.cat(halves).to(ref_dtype)).sum().backward()
    return ranks, ref.float(), y.detach().float(), full.grad.float()


@pytest.mark.slow
def test_two_rank_statistics_and_gradients_match_one_big_batch(tmp_path):
    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    ranks, ref, y, grad = _two_ranks_and_one_big_batch(x, tmp_path)

    torch.testing.assert_close(torch.cat([r['y'] for r in ranks]), y)
    torch.testing.assert_close(torch.cat([r['grad'] for r in ranks]), grad)
    # DDP averages parameter gradients over ranks; the sum of rank gradients is the full one.
    torch.testing.assert_close(ranks[0]['wgrad'] + ranks[1]['wgrad'], ref.weight.grad)
    for r in ranks:
        torch.testing.assert_close(r['mean'], ref.running_mean)
        torch.testing.assert_close(r['var'], ref.running_var)


@pytest.mark.slow
def test_large_mean_small_spread_stays_accurate(tmp_path):
    # 300 + 0.01 * N(0, 1) in float32: E[x^2] - mean^2 subtracts two numbers near 90000 whose
    # float32 spacing (0.008) is far above the variance (1e-4), and gave a negative variance,
    # so NaN outputs. Even a float32 mean alone is off by up to half its spacing (1.5e-5),
    # 0.15 % of the spread; the corrected two-pass statistics are float32-exact. The
    # reference is BatchNorm in float64 on the same float32 input (torch's own float32 CPU
    # BatchNorm is off by 3e-4 here).
    noise = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    x = 300 + 0.01 * noise
    ranks, ref, y, grad = _two_ranks_and_one_big_batch(x, tmp_path, ref_dtype=torch.float64)

    outputs = torch.cat([r['y'] for r in ranks])
    assert torch.isfinite(outputs).all()
    torch.testing.assert_close(outputs, y, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat([r['grad'] for r in ranks]), grad, rtol=1e-4,
                               atol=grad.abs().max().item() * 1e-5)
    torch.testing.assert_close(ranks[0]['wgrad'] + ranks[1]['wgrad'], ref.weight.grad,
                               rtol=1e-4, atol=1e-3)
    for r in ranks:
        # A running mean near 30 after one step: float32 spacing 2e-6 there.
        torch.testing.assert_close(r['mean'], ref.running_mean, rtol=0, atol=4e-6)
        torch.testing.assert_close(r['var'], ref.running_var, rtol=1e-4, atol=0)
