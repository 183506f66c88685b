"""Collapse diagnostics (teacher entropy, KL, prototypes in use) and CollapseMonitorHook."""
import logging
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import RuntimeInfoHook
from mmengine.logging import MessageHub
from mmengine.runner import Runner

from mst_mm.engine.hooks import CollapseMonitorHook, collapse_mode
from mst_mm.models import DINODistillHead
from tests.helpers import make_image_folder, scalars, tiny_runner_cfg

K = 64


def diagnostics(student, teacher, **head_kwargs):
    head = DINODistillHead(out_channels=K, **head_kwargs)
    return {k: float(v) for k, v in head.loss_and_diagnostics(student, teacher).items()}


def test_diagnostics_equal_their_definitions():
    torch.manual_seed(0)
    head = DINODistillHead(out_channels=K, student_temp=0.1, teacher_temp=0.05, loss_weight=0.5)
    head.center.copy_(torch.randn(1, K) * 0.1)
    center = head.center.clone()
    student, teacher = torch.randn(4 * 3, K), torch.randn(2 * 3, K)
    out = head.loss_and_diagnostics(student, teacher)

    p_t = F.softmax((teacher - center) / 0.05, dim=-1)
    log_p_t = F.log_softmax((teacher - center) / 0.05, dim=-1)
    log_p_s = F.log_softmax(student / 0.1, dim=-1)
    entropy = -(p_t * log_p_t).sum(-1).mean()
    kls = [(p_t[3 * i:3 * i + 3] * (log_p_t[3 * i:3 * i + 3] - log_p_s[3 * j:3 * j + 3]))
           .sum(-1).mean() for i in range(2) for j in range(4) if i != j]
    mean_p = p_t.mean(0)
    torch.testing.assert_close(out['teacher_entropy'], entropy)
    torch.testing.assert_close(out['teacher_student_kl'], torch.stack(kls).mean())
    torch.testing.assert_close(out['prototypes_in_use'], torch.exp(-(mean_p * mean_p.log()).sum()))
    torch.testing.assert_close(out['loss_dino'], 0.5 * (entropy + torch.stack(kls).mean()))
    assert not any(out[k].requires_grad for k in out if k != 'loss_dino')


def test_uniform_collapse_has_entropy_ln_k_and_no_kl():
    out = diagnostics(torch.zeros(4 * 2, K), torch.zeros(2 * 2, K))
    assert out['teacher_entropy'] == pytest.approx(math.log(K), rel=1e-6)
    assert out['teacher_student_kl'] == pytest.approx(0, abs=1e-5)
    assert out['prototypes_in_use'] == pytest.approx(K, rel=1e-5)
    assert collapse_mode(out['teacher_entropy'], out['teacher_student_kl'], K) == 'uniform'


def test_one_hot_collapse_has_no_entropy_no_kl_and_one_prototype():
    spike = torch.zeros(K)
    spike[3] = 50.
    out = diagnostics(spike.repeat(4 * 2, 1), spike.repeat(2 * 2, 1))
    assert out['teacher_entropy'] < 1e-6 and abs(out['teacher_student_kl']) < 1e-4
    assert out['prototypes_in_use'] == pytest.approx(1, abs=1e-4)
    assert collapse_mode(out['teacher_entropy'], out['teacher_student_kl'], K) == 'one-hot'


def test_a_learning_run_is_neither_mode():
    torch.manual_seed(1)
    out = diagnostics(torch.randn(4 * 8, K), torch.randn(2 * 8, K) * 3)
    assert out['teacher_student_kl'] > 0.1
    assert collapse_mode(out['teacher_entropy'], out['teacher_student_kl'], K) is None
    # A sharp teacher with a KL clearly above 0 is not one-hot collapse either.
    assert collapse_mode(0.01, 1.0, K) is None and collapse_mode(0.01, 0.0, K) == 'one-hot'


class FakeRunner(SimpleNamespace):

    def __init__(self):
        logger = logging.getLogger('collapse-monitor-test')
        super().__init__(iter=0, logger=logger, message_hub=MessageHub('collapse-monitor-test'),
                         model=SimpleNamespace(head=SimpleNamespace(center=torch.zeros(1, K))))


def feed(hook, runner, entropy, kl, times):
    """Iterations as the runner calls the hooks: mmengine's RuntimeInfoHook (priority
    VERY_HIGH) reads the outputs into the message hub, then the monitor runs."""
    for _ in range(times):
        outputs = dict(teacher_entropy=torch.tensor(entropy), teacher_student_kl=torch.tensor(kl))
        RuntimeInfoHook().after_train_iter(runner, 0, outputs=outputs)
        hook.after_train_iter(runner, 0, outputs=outputs)
        runner.iter += 1


def test_hook_warns_once_per_episode_after_the_window(caplog):
    hook, runner = CollapseMonitorHook(window=5), FakeRunner()
    with caplog.at_level(logging.WARNING, logger='collapse-monitor-test'):
        feed(hook, runner, math.log(K), 0.0, 4)
        assert not caplog.records                      # not yet a full window
        feed(hook, runner, math.log(K), 0.0, 10)
        assert len(caplog.records) == 1                # once, not every iteration
        message = caplog.records[0].getMessage()
        assert 'uniform collapse' in message and 'for 5 iterations' in message
        assert 'docs/reliability.md' in message
        feed(hook, runner, 3.0, 1.0, 3)                # learning again: re-armed
        feed(hook, runner, 0.0, 0.0, 5)
        assert len(caplog.records) == 2 and 'one-hot collapse' in caplog.records[1].getMessage()
    hook.after_train_iter(runner, 0, outputs=dict(loss=torch.tensor(1.)))  # k-NN etc.: ignored
    with pytest.raises(ValueError, match='window'):
        CollapseMonitorHook(window=0)


@pytest.mark.slow
def test_a_real_run_logs_the_diagnostics_and_the_default_hook_reads_them(tmp_path):
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp_path / 'work', max_epochs=2, batch_size=4)
    assert cfg.default_hooks.collapse_monitor.type == 'CollapseMonitorHook'
    # Thresholds that call every iteration "uniform", to see the warning reach the log.
    cfg.default_hooks.collapse_monitor = dict(type='CollapseMonitorHook', window=2,
                                              uniform_ratio=1e-6, one_hot_ratio=0.0,
                                              kl_ratio=1e6)
    cfg.log_processor = dict(window_size=1)   # losses unsmoothed, as the diagnostics are
    Runner.from_cfg(cfg).train()
    rows = [row for row in scalars(tmp_path / 'work') if 'loss_dino' in row]
    assert rows
    weight = cfg.model.head.get('loss_weight', 1.0)
    for row in rows:
        # The logged diagnostics are the loss's own terms: loss_dino = w (H(P_t) + KL), and
        # the batch-mean distribution's perplexity is at least exp of the mean entropy.
        assert row['loss_dino'] == pytest.approx(
            weight * (row['teacher_entropy'] + row['teacher_student_kl']), rel=1e-5)
        assert row['prototypes_in_use'] >= math.exp(row['teacher_entropy']) * (1 - 1e-5)
        assert row['loss'] == pytest.approx(row['loss_dino'] + row['loss_restore'], rel=1e-5)
    log = next((tmp_path / 'work').glob('*/*.log')).read_text()
    assert 'DINO uniform collapse: for 2 iterations' in log
