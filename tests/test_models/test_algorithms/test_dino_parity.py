"""One DINO-mode step of the full DeiT-S recipe against DINO's rules, written out here.

The model is `configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py` with the mask and the
decoder off and no drop-path:
the DINO baseline at full size (ViT-S/16, K = 65536). From hand-set weights and fixed crops
the test checks, against formulas and rules written from the DINO paper and the options of
its training script (not from its code):

- the loss: Eq. 2 with centring and sharpening, over every (teacher global, student other)
  pair, the projection head written as equations;
- the centre update;
- the student after two AdamW steps with per-parameter gradient clipping and DINO's
  parameter groups (no weight decay for biases and one-dimensional tensors), the last layer
  frozen in the first step (epoch 1) and free in the second;
- the EMA teacher after each step with DINO's cosine momentum from 0.996.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from tests.helpers import REPO

BATCH = 2
LR, WEIGHT_DECAY, BETAS, EPS = 5e-4 * 1024 / 256, 0.04, (0.9, 0.999), 1e-8
STUDENT_TEMP, TEACHER_TEMP, CENTER_MOMENTUM = 0.1, 0.04, 0.9
ITERS = 300 * 1251   # 300 epochs of ImageNet at batch 1024


def dino_momentum(it: int) -> float:
    """DINO's teacher momentum: cosine from 0.996 at iteration 0 to 1 at the end."""
    return 1 - (1 - 0.996) * (math.cos(math.pi * it / ITERS) + 1) / 2


def hand_set_weights(model) -> None:
    """Deterministic weights for every student tensor (the teacher copies them)."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith('teacher.'):
                continue
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith('original0'):           # weight-norm magnitude g
                param.copy_(1 + 0.1 * noise)
            elif name.endswith('bias'):
                param.copy_(0.01 * noise)
            elif param.dim() == 1:                   # LayerNorm / BatchNorm scales
                param.copy_(1 + 0.1 * noise)
            else:
                param.copy_(0.02 * noise)


def head_by_equations(neck, x):
    """DINO's projection head: (Linear, BN with batch statistics, GELU) x 2, Linear,
    L2 normalisation, then the weight-normalised prototypes g * v / ||v||."""
    mlp = neck.mlp
    for linear, bn in ((mlp[0], mlp[1]), (mlp[3], mlp[4])):
        h = x @ linear.weight.t() + linear.bias
        mean, var = h.mean(0), h.var(0, unbiased=False)
        x = F.gelu((h - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias)
    x = x @ mlp[6].weight.t() + mlp[6].bias
    z = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    g = neck.last_layer.parametrizations.weight.original0
    v = neck.last_layer.parametrizations.weight.original1
    return z @ (g * v / v.norm(dim=1, keepdim=True)).t()


def dino_loss_by_equations(teacher_logits, student_logits, center):
    """Eq. 2: teacher crops (G) x student crops (all), skipping equal views."""
    teacher = [F.softmax((t - center) / TEACHER_TEMP, dim=-1) for t in teacher_logits]
    student = [F.log_softmax(s / STUDENT_TEMP, dim=-1) for s in student_logits]
    terms = [(-t * s).sum(-1).mean() for i, t in enumerate(teacher)
             for j, s in enumerate(student) if i != j]
    return sum(terms) / len(terms)


def dino_no_weight_decay(name: str, param) -> bool:
    """DINO's parameter groups: biases and every one-dimensional tensor are not decayed."""
    return name.endswith('bias') or param.dim() == 1


def adamw_by_hand(p0, grads, weight_decay):
    """torch's AdamW rule (decoupled decay) over the steps where the gradient exists."""
    p, m, v, step = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0), 0
    for g in grads:
        if g is None:   # frozen: no update, no decay, no moments
            continue
        step += 1
        p = p * (1 - LR * weight_decay)
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        m_hat, v_hat = m / (1 - BETAS[0]**step), v / (1 - BETAS[1]**step)
        p = p - LR * m_hat / (v_hat.sqrt() + EPS)
    return p


def clip_by_hand(grad, max_norm):
    coef = max_norm / (float(grad.norm(2)) + 1e-6)
    return grad * coef if coef < 1 else grad


@pytest.fixture(scope='module')
def dino_mode():
    cfg = Config.fromfile(str(REPO / 'configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py'))
    cfg.model.mask_cfg = dict(mode='none')
    cfg.model.decoder_head = None
    cfg.model.backbone.drop_path_rate = 0.
    MessageHub.get_current_instance().update_info('max_iters', ITERS)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    hand_set_weights(model)
    return cfg, model.train()


@pytest.mark.slow
def test_one_dino_step_of_the_full_recipe_follows_dinos_rules(dino_mode):
    cfg, model = dino_mode
    gen = torch.Generator().manual_seed(0)
    crops = ([torch.randn(BATCH, 3, 224, 224, generator=gen) for _ in range(2)]
             + [torch.randn(BATCH, 3, 96, 96, generator=gen) for _ in range(2)])
    student = dict(model.backbone.named_parameters(prefix='backbone'))
    student.update(model.neck.named_parameters(prefix='neck'))
    last_layer = {n for n in student if n.startswith('neck.last_layer')}
    p0 = {n: p.detach().clone() for n, p in student.items()}

    # --- the loss and the centre, from the equations ---
    loss = model.loss(crops, [])['loss_dino']
    with torch.no_grad():
        feats = [model.backbone(c)[0] for c in crops]   # final-normed CLS tokens
        teacher_logits = head_by_equations(model.neck, torch.cat(feats[:2])).chunk(2)
        student_logits = (head_by_equations(model.neck, torch.cat(feats[:2])).chunk(2)
                          + head_by_equations(model.neck, torch.cat(feats[2:])).chunk(2))
        expected_loss = dino_loss_by_equations(teacher_logits, student_logits, center=0.)
        expected_center = (1 - CENTER_MOMENTUM) * torch.cat(teacher_logits).mean(0)
    torch.testing.assert_close(loss.detach(), expected_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(model.head.center[0], expected_center, rtol=1e-4, atol=1e-7)

    # --- two steps: clipping, groups, AdamW, the frozen last layer, the EMA teacher ---
    loss.backward()
    grads = [{n: p.grad.clone() for n, p in student.items() if p.grad is not None}]
    # A threshold at the median gradient norm clips half of the tensors: the rule is used.
    max_norm = float(torch.stack([g.norm() for g in grads[0].values()]).median())
    optim_cfg = cfg.optim_wrapper.copy()
    optim_cfg.clip_grad = dict(type='per_param', max_norm=max_norm)
    # In the config's scope, as the Runner builds it (mst_mm's optimiser constructor lives
    # in mmpretrain's registry).
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, optim_cfg)
    optim_wrapper.freeze([student[n] for n in last_layer])   # epoch 1
    optim_wrapper.step()
    optim_wrapper.zero_grad()
    teacher_0 = {n: p.clone() for n, p in p0.items() if 'mask_token' not in n}

    optim_wrapper.freeze([])                                  # epoch 2
    p1 = {n: p.detach().clone() for n, p in student.items()}
    model.loss(crops, [])['loss_dino'].backward()              # teacher := EMA(student_1)
    grads.append({n: p.grad.clone() for n, p in student.items() if p.grad is not None})
    teacher_1 = {n: dino_momentum(0) * t + (1 - dino_momentum(0)) * p1[n]
                 for n, t in teacher_0.items()}
    optim_wrapper.step()
    with torch.no_grad():
        model.loss(crops, [])                                  # teacher := EMA(student_2)

    clipped = 0
    for name, param in student.items():
        if 'mask_token' in name:   # not in DINO; mask off, so its gradient is 0
            assert torch.equal(param, p0[name])
            continue
        steps = []
        for step, step_grads in enumerate(grads):
            grad = step_grads.get(name)
            if grad is None or (step == 0 and name in last_layer):
                steps.append(None)
                continue
            steps.append(clip_by_hand(grad, max_norm))
            clipped += not torch.equal(steps[-1], grad)
        decay = 0. if dino_no_weight_decay(name, param) else WEIGHT_DECAY
        expected = adamw_by_hand(p0[name], steps, decay)
        torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=2e-8, msg=name)
    assert clipped > len(student) // 2
    for name in last_layer:   # frozen in step 1, so exactly one AdamW step from p0
        assert optim_wrapper.optimizer.state[student[name]]['step'] == 1

    teacher = dict(model.teacher.module[0].named_parameters(prefix='backbone'))
    teacher.update(model.teacher.module[1].named_parameters(prefix='neck'))
    assert set(teacher) == set(teacher_0)
    m = dino_momentum(1)
    for name, param in teacher.items():
        expected = m * teacher_1[name] + (1 - m) * student[name].detach()
        torch.testing.assert_close(param, expected, rtol=1e-6, atol=1e-9, msg=name)
