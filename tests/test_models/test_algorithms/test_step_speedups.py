"""The faster DINO/MST step computes what the straightforward formulation computed.

Each speed-up of the training step is checked here against the straightforward formulation,
written out in this file, on fixed inputs
(``DINODistillHead``'s one matrix product over the crop pairs: Eq. 2 written out in
tests/test_models/test_heads/test_dino_head.py; here, that its graph does not grow with the crops):

- ``DINONeck.forward_crops``: the weight-normalised last layer once for all crops instead of
  once for the global and once for the local crops;
- ``FusedCosineEMA``: one ``torch._foreach_lerp_`` instead of mmpretrain's ``CosineEMA``
  loop over named parameter pairs.

Each test also checks the property that makes the faster form cheaper, which the
straightforward one does not have, so that a return to it fails.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmpretrain.models import CosineEMA
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from mst_mm.models import DINODistillHead, DINONeck, FusedCosineEMA
from tests.conftest import crops, tiny_mst_cfg

K, BATCH, GLOBAL = 64, 3, 2


def graph_size(tensor: torch.Tensor) -> int:
    """Autograd nodes behind ``tensor``."""
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return len(seen)


def test_dino_loss_graph_does_not_grow_with_the_number_of_crops():
    sizes = []
    for num_crops in (4, 10):
        student = torch.randn(num_crops * BATCH, K, requires_grad=True)
        loss = DINODistillHead(K).loss(student, torch.randn(GLOBAL * BATCH, K))
        sizes.append(graph_size(loss))
    # The pair loop added a few nodes per pair: 6 pairs -> 18 pairs tripled the graph.
    assert sizes[0] == sizes[1] < 15


def two_call_crops(neck: DINONeck, global_feat, local_feats):
    """What ``forward_crops`` computed before: the whole neck once per group."""
    return torch.cat([neck(global_feat), neck(torch.cat(local_feats), update_bn_stats=False)])


def tiny_neck(seed=0):
    torch.manual_seed(seed)
    neck = DINONeck(in_channels=16, hidden_channels=32, bottleneck_channels=8,
                    out_channels=K, norm_last_layer=False)
    neck.init_weights()
    with torch.no_grad():   # a magnitude that is not 1, so that g takes part
        neck.last_layer.parametrizations.weight.original0.uniform_(0.5, 1.5)
    return neck.train()


def test_neck_forward_crops_equals_two_calls_in_output_gradients_and_bn_statistics():
    gen = torch.Generator().manual_seed(0)
    global_feat = torch.randn(2 * BATCH, 16, generator=gen)
    local_feats = [torch.randn(4 * BATCH, 16, generator=gen) * 2 + 1]
    target = torch.randn(6 * BATCH, K, generator=gen)
    results = []
    for forward in (DINONeck.forward_crops, two_call_crops):
        neck = tiny_neck()
        out = forward(neck, global_feat, local_feats)
        (out * target).sum().backward()
        stats = [t.clone() for m in neck.mlp if isinstance(m, nn.BatchNorm1d)
                 for t in (m.running_mean, m.running_var, m.num_batches_tracked)]
        grads = {n: p.grad.clone() for n, p in neck.named_parameters()}
        results.append((out.detach(), grads, stats))
    (out, grads, stats), (old_out, old_grads, old_stats) = results
    torch.testing.assert_close(out, old_out, rtol=1e-6, atol=1e-7)
    assert set(grads) == set(old_grads)
    for name in grads:
        # One product over all crops sums the last layer's gradient in another order than two
        # products do: float32 rounding of the tensor's scale, not of each (small) element.
        # Seen: 3.3e-6 on a gradient of scale 16.6 on one Xeon, exact on another.
        scale = old_grads[name].abs().max().item()
        torch.testing.assert_close(grads[name], old_grads[name], rtol=1e-5,
                                   atol=max(1e-6 * scale, 1e-7), msg=name)
    for new, old in zip(stats, old_stats):
        torch.testing.assert_close(new, old)


def test_neck_forms_the_last_layer_weight_once_for_all_crops():
    neck = tiny_neck()
    calls = []
    neck.last_layer.parametrizations.weight[0].register_forward_hook(
        lambda *args: calls.append(1))
    neck.forward_crops(torch.randn(2 * BATCH, 16), [torch.randn(4 * BATCH, 16)])
    assert len(calls) == 1   # two calls formed g v / ||v|| (K x 8 here) twice


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 5)
        self.bn = nn.BatchNorm1d(5)
        self.extra = nn.Parameter(torch.zeros(3))   # the student's [MASK]: not averaged


def average_pair(ema_type, update_buffers=False):
    torch.manual_seed(0)
    student = Net()
    teacher = Net()
    del teacher.extra
    teacher.load_state_dict(student.state_dict(), strict=False)
    return student, ema_type(teacher, momentum=0.05, end_momentum=0.01,
                             update_buffers=update_buffers)


@pytest.mark.parametrize('update_buffers', [False, True])
def test_fused_ema_equals_cosine_ema_over_steps(message_hub, update_buffers):
    pairs = {t: average_pair(t, update_buffers) for t in (FusedCosineEMA, CosineEMA)}
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        noise = {n: torch.randn(p.shape, generator=gen) for n, p in Net().named_parameters()}
        stats = torch.randn(2, 5, generator=gen)
        for student, ema in pairs.values():
            with torch.no_grad():
                for name, param in student.named_parameters():
                    param.add_(noise[name] * 0.1)
                student.bn.running_mean.copy_(stats[0])
                student.bn.running_var.copy_(stats[1].abs())
                student.bn.num_batches_tracked += 1
            ema.update_parameters(student)
    fused, reference = (pairs[t][1].state_dict() for t in (FusedCosineEMA, CosineEMA))
    assert list(fused) == list(reference)   # same checkpoint keys, 'steps' included
    for key in reference:
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-6, atol=1e-7, msg=key)
    assert int(fused['steps']) == 5


def test_fused_ema_never_calls_the_per_parameter_update(message_hub, monkeypatch):
    student, ema = average_pair(FusedCosineEMA)
    calls = []
    monkeypatch.setattr(ema, 'avg_func', lambda *args: calls.append(1))
    for _ in range(3):
        ema.update_parameters(student)
    assert calls == [] and int(ema.steps) == 3


def test_fused_ema_follows_a_student_moved_after_the_first_update(message_hub):
    student, ema = average_pair(FusedCosineEMA)
    ema.update_parameters(student)
    student.double()   # swaps every parameter's storage, as .to(device) does
    ema.module.double()
    with torch.no_grad():
        student.linear.weight.fill_(1.0)
    before = ema.module.linear.weight.detach().clone()
    ema.update_parameters(student)
    # The cosine momentum from 0.05 to 0.01 over the hub's 100 iterations, at step 1.
    momentum = 0.01 + (0.05 - 0.01) * (math.cos(math.pi * 1 / 100) + 1) / 2
    expected = before + momentum * (1.0 - before)
    torch.testing.assert_close(ema.module.linear.weight.detach(), expected)
    assert ema.module.linear.weight.dtype == torch.float64


def build_mst(**overrides):
    torch.manual_seed(0)
    model = MODELS.build(tiny_mst_cfg(**overrides))
    model.init_weights()
    return model.train()


def test_mst_logs_the_fraction_of_masked_patches(message_hub):
    # 16 patches per 32-px crop; num=4: the 4 least attended are candidates; p=1 masks
    # every candidate, so exactly a quarter of the patches.
    losses = build_mst(mask_cfg=dict(num=4, p=1.0, mode='attention')).loss(crops(), [])
    assert float(losses['masked_fraction']) == 0.25
    assert float(build_mst(mask_cfg=dict(mode='none')).loss(crops(), [])['masked_fraction']) \
        == 0.0
    random = build_mst(mask_cfg=dict(num=4, p=0.5, mode='random'))
    torch.manual_seed(0)
    assert 0.3 < float(random.loss(crops(batch=16), [])['masked_fraction']) < 0.7


@pytest.mark.parametrize('shape', [(2, 5, 7, 6), (1, 3, 1, 1)])
def test_fused_upsample_conv_equals_upsampling_then_convolving(shape):
    from mst_mm.models.heads.decoder_head import upsample2x_conv3x3
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    weight = torch.randn(4, shape[1], 3, 3, generator=gen, dtype=torch.float64)
    bias = torch.randn(4, generator=gen, dtype=torch.float64)
    expected = F.conv2d(F.interpolate(x, scale_factor=2, mode='nearest'), weight, bias,
                        padding=1)
    torch.testing.assert_close(upsample2x_conv3x3(x, weight, bias), expected,
                               rtol=1e-12, atol=1e-12)


def test_channels_last_conv_equals_the_plain_conv_in_value_and_gradients():
    from mst_mm.models.heads.decoder_head import ChannelsLastConv2d
    torch.manual_seed(0)
    conv = ChannelsLastConv2d(8, 3, 3, padding=1)
    plain = nn.Conv2d(8, 3, 3, padding=1)
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(2, 8, 16, 16)
    results = []
    for module in (conv, plain):
        inputs = x.clone().requires_grad_()
        out = module(inputs)
        out.square().sum().backward()
        results.append((out, inputs.grad, module.weight.grad, module.bias.grad))
    # The layout the speed comes from (docs/benchmarks.md) is really used.
    assert results[0][0].is_contiguous(memory_format=torch.channels_last)
    assert not results[1][0].is_contiguous(memory_format=torch.channels_last)
    # torch's float32 tolerances: the layouts sum the weight gradient's 512 products in
    # different orders, and oneDNN picks its kernels per CPU (an AMD EPYC VM differed by
    # 6e-6 in one of 216 values, past rtol=1e-5 with atol=1e-6). A wrong layout is O(1) off.
    for new, old in zip(*results):
        torch.testing.assert_close(new, old)


def unfused_decoder(head: nn.Module, feats: torch.Tensor) -> torch.Tensor:
    """The paper's decoder written out: per stage, upsample 2x, then conv3x3-BN-ReLU."""
    x = feats
    *stages, last = head.decoder
    for stage in stages:
        x = F.interpolate(x, scale_factor=2, mode='nearest')
        x = F.relu(stage.norm(stage.conv(x)))
    return last(x)


def test_decoder_equals_upsampling_then_convolving_in_output_gradients_and_bn_statistics():
    from mst_mm.models import ImageDecoderHead
    torch.manual_seed(0)
    head = ImageDecoderHead(in_channels=32, channels=(16, 8, 8))
    head.init_weights()
    feats = torch.randn(3, 32, 4, 4)
    image = torch.randn(3, 3, 32, 32)
    results = []
    for fused in (True, False):   # the head's forward, then the unfused reference
        model = copy.deepcopy(head).train()
        restored = model(feats) if fused else unfused_decoder(model, feats)
        F.l1_loss(restored, image).backward()
        results.append((restored.detach(), {n: p.grad for n, p in model.named_parameters()},
                        [b.clone() for b in model.buffers()]))
    (out, grads, buffers), (old_out, old_grads, old_buffers) = results
    torch.testing.assert_close(out, old_out, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], old_grads[name], rtol=1e-4, atol=1e-6,
                                   msg=name)
    for new, old in zip(buffers, old_buffers):
        torch.testing.assert_close(new, old)


def test_decoder_never_convolves_at_the_upsampled_size():
    from mst_mm.models import ImageDecoderHead
    head = ImageDecoderHead(in_channels=32, channels=(16, 8, 8)).train()
    conv_inputs = []
    for module in head.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_pre_hook(lambda m, args: conv_inputs.append(args[0].shape))
    upsampled = []
    for module in head.decoder:
        if isinstance(module, nn.Upsample):
            module.register_forward_hook(lambda *args: upsampled.append(1))
    assert head(torch.randn(2, 32, 4, 4)).shape == (2, 3, 32, 32)
    assert upsampled == []
    # Only the last conv (RGB) runs at full size; the stages' convs are not called as
    # modules at all (their weights go to the fused convolution).
    assert conv_inputs == [(2, 8, 32, 32)]


def test_decoder_keys_are_one_module_per_stage_then_the_rgb_conv():
    from mst_mm.models import ImageDecoderHead
    keys = set(ImageDecoderHead(in_channels=32, channels=(16, 8)).state_dict())
    assert {'decoder.0.conv.weight', 'decoder.0.bn.weight', 'decoder.1.conv.weight',
            'decoder.1.bn.running_var', 'decoder.2.weight', 'decoder.2.bias'} <= keys
    assert not any(key.startswith('decoder.3.') for key in keys)
