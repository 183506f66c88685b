"""The mask rule, Eq. 3 and Eq. 6."""
import pytest
import torch

from mst_mm.models.utils import attention_mask


def _attn(batch=64, patches=196, seed=0):
    return torch.rand(batch, patches, generator=torch.Generator().manual_seed(seed))


def test_masked_patches_lie_below_the_one_over_num_threshold():
    attn = _attn()
    num = 8
    mask = attention_mask(attn, num=num, p=0.5, generator=torch.Generator().manual_seed(1))
    k = attn.shape[1] // num
    tau = attn.sort(dim=1).values[:, k - 1:k]  # the k-th lowest attention of each image
    assert mask.any()
    assert bool((attn[mask] <= tau.expand_as(attn)[mask]).all())
    assert int(mask.sum(dim=1).max()) <= k


def test_p_one_masks_exactly_the_candidates():
    attn = _attn(batch=4, patches=196)
    mask = attention_mask(attn, num=8, p=1.0)
    lowest = attn.argsort(dim=1)[:, :196 // 8]
    expected = torch.zeros_like(mask).scatter_(1, lowest, True)
    assert torch.equal(mask, expected)
    assert mask.sum(dim=1).tolist() == [24] * 4


def test_attention_rate_is_p_over_num_and_random_rate_is_p():
    attn = _attn(batch=512, patches=196)
    gen = torch.Generator().manual_seed(3)
    guided = attention_mask(attn, num=8, p=0.1, generator=gen).float().mean().item()
    rand = attention_mask(attn, num=8, p=0.1, mode='random', generator=gen).float().mean().item()
    expected_guided = 0.1 * (196 // 8) / 196
    assert abs(guided - expected_guided) < 0.002, guided
    assert abs(rand - 0.1) < 0.005, rand


def test_random_mode_ignores_attention_and_none_masks_nothing():
    attn = _attn(batch=256)
    mask = attention_mask(attn, p=0.3, mode='random', generator=torch.Generator().manual_seed(99))
    high = attn > attn.median(dim=1, keepdim=True).values
    # Random masking hits high-attention patches as often as low ones.
    assert abs(mask[high].float().mean().item() - mask[~high].float().mean().item()) < 0.02
    assert not attention_mask(attn, p=1.0, mode='none').any()


def test_generator_makes_masks_reproducible():
    attn = _attn()
    a = attention_mask(attn, p=0.5, generator=torch.Generator().manual_seed(7))
    b = attention_mask(attn, p=0.5, generator=torch.Generator().manual_seed(7))
    c = attention_mask(attn, p=0.5, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize('kwargs, message', [
    (dict(num=0), 'num'),
    (dict(p=-0.1), 'p'),
    (dict(p=1.5), 'p'),
    (dict(mode='topk'), 'mode'),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        attention_mask(_attn(batch=2), **kwargs)
