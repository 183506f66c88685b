"""Logs that read cleanly: no optimiser warning per teacher parameter, the same parameter
groups as mmengine's constructor; the scheduled weight decay and teacher momentum logged."""
import math

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper as _build_optim_wrapper
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401  (registers the constructor)
from tests.helpers import DEMO_CONFIG, make_image_folder, mmlogger_records, scalars, tiny_runner_cfg


def build_optim_wrapper(model, cfg):
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # as the Runner builds it
        return _build_optim_wrapper(model, cfg)


def _groups(optim_wrapper) -> list:
    return [({id(p) for p in g['params']}, {k: v for k, v in g.items() if k != 'params'})
            for g in optim_wrapper.optimizer.param_groups]


def test_the_teacher_gives_no_optimiser_warnings_and_the_groups_stay_mmengines():
    cfg = Config.fromfile(DEMO_CONFIG)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    assert cfg.optim_wrapper.constructor == 'StudentOptimWrapperConstructor'
    mmengines = cfg.optim_wrapper.copy()
    mmengines.constructor = 'DefaultOptimWrapperConstructor'

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

    # The same groups, in the same order, with the same settings; as plain dicts, where
    # mmengine's are ConfigDicts, which torch.compile cannot trace (tests/test_compile.py).
    assert _groups(ours) == _groups(default)
    assert {type(g).__name__ for g in default.optimizer.param_groups} == {'ConfigDict'}
    assert {type(g) for g in ours.optimizer.param_groups} == {dict}
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    assert set().union(*(ids for ids, _ in _groups(ours))) == trained
    decays = sorted({g['weight_decay'] for _, g in _groups(ours)})
    assert decays == [0.0, cfg.optim_wrapper.optimizer.weight_decay]
    assert {g['lr'] for _, g in _groups(ours)} == {cfg.optim_wrapper.optimizer.lr}


def test_a_frozen_student_parameter_still_gets_mmengines_warning():
    cfg = Config.fromfile(DEMO_CONFIG)
    model = MODELS.build(cfg.model)
    model.backbone.cls_token.requires_grad_(False)
    with mmlogger_records() as records:
        build_optim_wrapper(model, cfg.optim_wrapper)
    messages = [r.getMessage() for r in records if 'requires_grad=False' in r.getMessage()]
    assert messages == ['backbone.cls_token is skipped since its requires_grad=False']


def test_weight_decay_and_teacher_momentum_are_logged_every_iteration(tmp_path):
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
    assert rows[0]['wd'] == pytest.approx(base_wd)
    assert rows[0]['teacher_momentum'] == pytest.approx(0.996)
