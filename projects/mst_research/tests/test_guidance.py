"""Guidance shares against object masks, and the linear probe on cached features."""
import pytest
import torch

from mst_research.probes import guidance_shares, linear_probe_top1, patch_object_mask


def test_patch_counts_as_object_when_half_its_pixels_are():
    pixels = torch.zeros(1, 8, 8, dtype=torch.bool)
    pixels[0, :4, :2] = True        # top-left patch: exactly half
    pixels[0, :1, 4:8] = True       # top-right patch: a quarter
    pixels[0, 4:, 4:] = True        # bottom-right patch: all
    assert patch_object_mask(pixels, 4).tolist() == [[True, False, False, True]]
    with pytest.raises(ValueError, match=r'\(B, H, W\)'):
        patch_object_mask(pixels[0], 4)


def _object_and_attention(on_object: float, off_object: float):
    obj = torch.zeros(2, 16, dtype=torch.bool)
    obj[0, :4] = True
    obj[1, 6:10] = True
    attn = torch.where(obj, torch.tensor(on_object), torch.tensor(off_object))
    return obj, attn / attn.sum(1, keepdim=True)


def test_attention_on_the_object_keeps_the_candidates_off_it():
    obj, attn = _object_and_attention(on_object=0.2, off_object=0.2 / 12)
    shares = guidance_shares(attn, obj, num=4, p=1.0)
    assert shares['object_area_share'] == pytest.approx(0.25)
    # 4 x 0.2 on the object against 12 x 0.2 / 12 off it: 0.8 / 1.0
    assert shares['attention_on_object_share'] == pytest.approx(0.8)
    assert shares['candidates_on_object_share'] == 0.0   # the 4 lowest are background
    assert shares['masked_on_object_share'] == 0.0       # p = 1 masks every candidate


def test_attention_off_the_object_puts_the_candidates_on_it():
    obj, attn = _object_and_attention(on_object=0.01, off_object=0.2)
    shares = guidance_shares(attn, obj, num=4, p=1.0)
    assert shares['attention_on_object_share'] == pytest.approx(0.04 / (0.04 + 2.4))
    assert shares['candidates_on_object_share'] == 1.0
    assert shares['masked_on_object_share'] == 1.0


def test_masked_share_is_one_seeded_draw_among_the_candidates():
    torch.manual_seed(0)
    obj = torch.rand(200, 64) < 0.3
    attn = torch.rand(200, 64)
    shares = guidance_shares(attn, obj, num=8, p=0.5, seed=3)
    area = float(obj.float().mean())
    assert shares == guidance_shares(attn, obj, num=8, p=0.5, seed=3)
    # Uninformative attention: every share is the object's area share, up to sampling.
    assert shares['attention_on_object_share'] == pytest.approx(area, abs=0.02)
    assert shares['candidates_on_object_share'] == pytest.approx(area, abs=0.04)
    assert shares['masked_on_object_share'] == pytest.approx(area, abs=0.06)
    with pytest.raises(ValueError, match='same'):
        guidance_shares(attn, obj[:, :32])


def test_linear_probe_separates_separable_classes_and_not_noise():
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=generator) * 4
    labels = torch.arange(400) % 4
    feats = centres[labels] + torch.randn(400, 16, generator=generator)
    assert linear_probe_top1(feats[:300], labels[:300], feats[300:], labels[300:]) == 100.0
    noise = torch.randn(400, 16, generator=generator)
    assert linear_probe_top1(noise[:300], labels[:300], noise[300:], labels[300:]) < 45.0
