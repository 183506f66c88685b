"""mst_mm.compat: each torch feature that torch 2.1 lacks, by detection, on any torch."""
import pytest
import torch
import torch.nn.functional as F

from mst_mm import compat


def test_the_math_backend_computes_attention_by_the_book():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    with compat.math_attention():
        out = F.scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1) @ v
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_fused_support_is_what_building_the_optimiser_says():
    def builds() -> bool:
        try:
            torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
        except RuntimeError:
            return False
        return True

    assert compat.fused_supported(torch.optim.AdamW, torch.device('cpu')) == builds()
    assert not compat.fused_supported(torch.optim.LBFGS, torch.device('cpu'))  # no fused


def test_a_grad_scaler_for_the_device_or_a_refusal_naming_the_torch(monkeypatch):
    if hasattr(torch.amp, 'GradScaler'):
        scaler = compat.grad_scaler('cpu', init_scale=4.0)
        assert scaler.get_scale() == 4.0
    monkeypatch.delattr(torch.amp, 'GradScaler', raising=False)
    with pytest.raises(RuntimeError, match=r'GradScaler for CUDA only.*torch 2.3'):
        compat.grad_scaler('cpu')
