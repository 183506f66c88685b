"""mst_mm.compat: each torch feature that torch 2.1 lacks, by detection, on any torch."""
import torch

from mst_mm import compat


def test_fused_support_is_what_building_the_optimiser_says():
    def builds() -> bool:
        try:
            torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
        except RuntimeError:
            return False
        return True

    assert compat.fused_supported(torch.optim.AdamW, torch.device('cpu')) == builds()
    assert not compat.fused_supported(torch.optim.LBFGS, torch.device('cpu'))  # no fused
