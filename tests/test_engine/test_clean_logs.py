"""Logs that read cleanly: no optimiser warning per teacher parameter, mmengine's parameter
groups merged where their settings are equal; the scheduled weight decay, the teacher momentum
and the clipping's gradient statistics logged."""
import math

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper as _build_optim_wrapper
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401  (registers the constructor)
from mst_mm.compat import fused_supported
from tests.helpers import DEMO_CONFIG, make_image_folder, mmlogger_records, scalars, tiny_runner_cfg


def build_optim_wrapper(model, cfg):
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # as the Runner builds it
        return _build_optim_wrapper(model, cfg)


def _groups(optim_wrapper) -> list:
    return [({id(p) for p in g['params']}, {k: v for k, v in g.items() if k != 'params'})
            for g in optim_wrapper.optimizer.param_groups]


def test_the_teacher_gives_no_optimiser_warnings_and_mmengines_equal_groups_are_merged():
    cfg = Config.fromfile(DEMO_CONFIG)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    assert cfg.optim_wrapper.constructor == 'StudentOptimWrapperConstructor'
    mmengines = cfg.optim_wrapper.copy()
    mmengines.constructor = 'DefaultOptimWrapperConstructor'
    mmengines.pop('mixed_precision', None)  # our constructor's key, unknown to mmengine's
    if not fused_supported(torch.optim.AdamW, torch.device('cpu')):  # torch < 2.4
        mmengines.optimizer = dict(mmengines.optimizer, fused=None, foreach=True)  # as ours

    with mmlogger_records() as default_records:
        default = build_optim_wrapper(model, mmengines)
    with mmlogger_records() as our_records:
        ours = build_optim_wrapper(model, cfg.optim_wrapper)

    skipped = [r.getMessage() for r in default_records if 'requires_grad=False' in
               r.getMessage()]
    teacher_params = sum(1 for _ in model.teacher.parameters())
    assert len(skipped) == teacher_params > 0  # mmengine: one warning per teacher tensor
    assert all(m.startswith('teacher.') for m in skipped)
    assert not [r for r in our_records if 'requires_grad=False' in r.getMessage()]

    # mmengine: one group per parameter. Ours: one per distinct setting, in the order of
    # first appearance, each parameter with mmengine's settings and in mmengine's order
    # within its group; as plain dicts, where mmengine's are ConfigDicts, which
    # torch.compile cannot trace (tests/test_engine/test_compile.py).
    theirs = _groups(default)
    assert len(theirs) == sum(1 for p in model.parameters() if p.requires_grad)
    distinct = []
    for _, settings in theirs:
        if settings not in distinct:
            distinct.append(settings)
    assert [settings for _, settings in _groups(ours)] == distinct
    for group in ours.optimizer.param_groups:
        settings = {k: v for k, v in group.items() if k != 'params'}
        assert [id(p) for p in group['params']] == [
            next(iter(ids)) for ids, their in theirs if their == settings]
    assert {type(g).__name__ for g in default.optimizer.param_groups} == {'ConfigDict'}
    assert {type(g) for g in ours.optimizer.param_groups} == {dict}
    # decayed weights; [MASK] (decay_mult=0 by name); biases and norms
    decays = [g['weight_decay'] for _, g in _groups(ours)]
    assert decays == [cfg.optim_wrapper.optimizer.weight_decay, 0.0, 0.0]
    assert _groups(ours)[1][1]['decay_mult'] == 0.0
    assert {g['lr'] for _, g in _groups(ours)} == {cfg.optim_wrapper.optimizer.lr}


def demo_model_and_wrapper(merge: bool):
    """The demo config's model (seed 0) with merged or mmengine's per-parameter groups."""
    cfg = Config.fromfile(DEMO_CONFIG)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    return model, build_optim_wrapper(model, dict(cfg.optim_wrapper, merge_param_groups=merge))


def settings_by_name(model, optim_wrapper) -> dict:
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)]: (g['lr'], g['weight_decay'])
            for g in optim_wrapper.optimizer.param_groups for p in g['params']}


def test_merged_groups_train_and_schedule_as_per_parameter_groups(message_hub):
    """Three steps (the neck's last layer frozen in the first, clipped per parameter, AdamW)
    under the configs' lr warm-up and weight-decay cosine (eta_min_ratio): every parameter
    gets the same lr and weight decay at every step, 0 staying 0, and the students, teachers
    and AdamW moments end equal bit for bit."""
    from mmengine.optim import CosineAnnealingParamScheduler, LinearLR
    runs = {}
    for merge in (True, False):
        model, wrapper = demo_model_and_wrapper(merge)
        schedulers = [LinearLR(wrapper, start_factor=0.1, begin=0, end=2, by_epoch=False),
                      CosineAnnealingParamScheduler(wrapper, param_name='weight_decay',
                                                    eta_min_ratio=10.0, begin=0, end=3,
                                                    by_epoch=False)]
        gen = torch.Generator().manual_seed(1)
        views = [torch.randint(0, 256, (4, 3, size, size), generator=gen).float()
                 for size in (32, 32, 16, 16, 16, 16)]
        torch.manual_seed(2)  # drop path and the mask's draws
        settings = []
        for step in range(3):
            wrapper.freeze(model.neck.last_layer.parameters() if step == 0 else [])
            settings.append(settings_by_name(model, wrapper))
            model.train_step(dict(inputs=views, data_samples=None), wrapper)
            for scheduler in schedulers:
                scheduler.step()
        names = {id(p): name for name, p in model.named_parameters()}
        moments = {names[id(p)]: state['exp_avg_sq']
                   for p, state in wrapper.optimizer.state.items()}
        runs[merge] = dict(groups=len(wrapper.optimizer.param_groups), settings=settings,
                           weights=model.state_dict(), moments=moments)
    merged, per_parameter = runs[True], runs[False]
    assert merged['groups'] == 3 < per_parameter['groups']
    assert merged['settings'] == per_parameter['settings']
    decays = [wd for _, wd in merged['settings'][-1].values()]
    assert 0.0 in decays and max(decays) > 0.04   # the undecayed stay at 0 as the rest rise
    for key, value in per_parameter['weights'].items():
        assert torch.equal(merged['weights'][key], value), key
    assert merged['moments'].keys() == per_parameter['moments'].keys()
    for key, value in per_parameter['moments'].items():
        assert torch.equal(merged['moments'][key], value), key


def test_an_optimiser_state_of_per_parameter_groups_is_refused_with_the_fix(message_hub):
    """Checkpoints saved with merge_param_groups=False hold one group per parameter (and per-group
    scheduler states, which mmengine would zip with the merged groups): the merged optimiser
    refuses them, naming the option that loads them as they were."""
    model, old = demo_model_and_wrapper(merge=False)
    views = [torch.rand(2, 3, size, size) * 255 for size in (32, 32, 16, 16, 16, 16)]
    model.train_step(dict(inputs=views, data_samples=None), old)
    saved = old.state_dict()
    with pytest.raises(ValueError, match=r'(?s)parameter groups of one parameter.*'
                       r'optim_wrapper\.merge_param_groups=False'):
        demo_model_and_wrapper(merge=True)[1].load_state_dict(saved)
    per_parameter = demo_model_and_wrapper(merge=False)[1]
    per_parameter.load_state_dict(saved)
    assert len(per_parameter.optimizer.state) == len(old.optimizer.state) > 0

    # A merged state resumes into merged groups.
    model, merged = demo_model_and_wrapper(merge=True)
    model.train_step(dict(inputs=views, data_samples=None), merged)
    resumed = demo_model_and_wrapper(merge=True)[1]
    resumed.load_state_dict(merged.state_dict())
    assert len(resumed.optimizer.state) == len(merged.optimizer.state) > 0


def test_a_frozen_student_parameter_still_gets_mmengines_warning():
    cfg = Config.fromfile(DEMO_CONFIG)
    model = MODELS.build(cfg.model)
    model.backbone.cls_token.requires_grad_(False)
    with mmlogger_records() as records:
        build_optim_wrapper(model, cfg.optim_wrapper)
    messages = [r.getMessage() for r in records if 'requires_grad=False' in r.getMessage()]
    assert messages == ['backbone.cls_token is skipped since its requires_grad=False']


def test_weight_decay_teacher_momentum_and_gradient_statistics_are_logged_every_iteration(
        tmp_path):
    from mmengine.runner import Runner
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4)
    cfg = tiny_runner_cfg(data_root, tmp_path / 'work', max_epochs=2, batch_size=4)
    runner = Runner.from_cfg(cfg)
    runner.train()
    rows = [r for r in scalars(tmp_path / 'work') if 'loss' in r]
    max_iters = runner.max_iters
    assert [r['iter'] for r in rows] == list(range(1, max_iters + 1))
    base_wd = cfg.optim_wrapper.optimizer.weight_decay
    # Cosine 0.04 -> 0.4 (eta_min_ratio 10) over the iterations, logged before each update.
    for row in rows:
        step = row['iter'] - 1
        expected_wd = 10 * base_wd + (base_wd - 10 * base_wd) * (
            1 + math.cos(math.pi * step / max_iters)) / 2
        assert row['wd'] == pytest.approx(expected_wd, rel=1e-6)
        # DINO's convention: 1 - mmengine's momentum, 0.996 -> 1 over the run.
        expected_m = 1 - 0.004 * (math.cos(math.pi * step / max_iters) + 1) / 2
        assert row['teacher_momentum'] == pytest.approx(expected_m, abs=1e-9)
        # DINOOptimWrapper's, read after the step by ScheduleLoggerHook
        assert row['grad_norm'] > 0 and 0 <= row['grad_clipped_ratio'] <= 1
    assert rows[0]['wd'] == pytest.approx(base_wd)
    assert rows[0]['teacher_momentum'] == pytest.approx(0.996)


def test_gradient_statistics_are_the_mean_since_the_last_print(tmp_path):
    """At logger interval 2, ``grad_norm`` and ``grad_clipped_ratio`` at each print are the
    mean of the two iterations' values (read once, summed on the device), and the teacher's
    momentum is the one of the printed iteration: the same run, printed every iteration,
    gives those values."""
    from mmengine.runner import Runner
    data_root = make_image_folder(tmp_path / 'data', classes=2, per_class=4)
    rows = {}
    for interval in (1, 2):
        cfg = tiny_runner_cfg(data_root, tmp_path / f'work{interval}', max_epochs=2,
                              batch_size=2)
        cfg.default_hooks.logger.interval = interval
        cfg.log_processor = dict(window_size=1)
        cfg.experiment_name = f'interval{interval}'
        Runner.from_cfg(cfg).train()
        rows[interval] = {r['iter']: r for r in scalars(tmp_path / f'work{interval}')
                          if 'loss' in r}
    every, paired = rows[1], rows[2]
    assert sorted(paired) == [2, 4, 6, 8] and sorted(every) == list(range(1, 9))
    for it, row in paired.items():
        assert row['loss'] == pytest.approx(every[it]['loss'], rel=1e-6)  # the same run
        for name in ('grad_norm', 'grad_clipped_ratio'):
            expected = (every[it - 1][name] + every[it][name]) / 2
            assert row[name] == pytest.approx(expected, rel=1e-6), (it, name)
        assert row['teacher_momentum'] == pytest.approx(every[it]['teacher_momentum'],
                                                        abs=1e-12)
