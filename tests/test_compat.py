"""mst_mm.compat: what the supported torch releases have, as their release notes say (fused
CPU AdamW from 2.4) and as seen here (torch 2.1's CPU bfloat16 attention backward)."""
import torch

from mst_mm import compat

TORCH = tuple(int(part) for part in torch.__version__.split('+')[0].split('.')[:2])


def test_fused_adamw_on_the_cpu_is_found_from_torch_2_4_on():
    assert compat.fused_supported(torch.optim.AdamW, torch.device('cpu')) is (TORCH >= (2, 4))
    assert not compat.fused_supported(torch.optim.LBFGS, torch.device('cpu'))  # no fused


def test_the_cpu_bfloat16_fault_is_flagged_on_torch_2_1_only():
    assert compat.CPU_BFLOAT16_BACKWARD_CORRUPTS is (TORCH == (2, 1))
