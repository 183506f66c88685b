"""RandomStateHook without processes: per-rank seeding, and what each rank restores from
new, old and differently sized checkpoints (the 2-process runs are in test_distributed.py)."""
import random
from types import SimpleNamespace
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch
from mmengine.hooks import CheckpointHook

from mst_mm.engine import load_local_checkpoint
from mst_mm.engine.hooks import RandomStateHook
from mst_mm.engine.hooks import random_state_hook as module
from mst_mm.engine.hooks.random_state_hook import get_rng_state, seed_rank, set_rng_state


def draws() -> tuple:
    return (int(torch.randint(0, 2**31, ())), int(np.random.randint(2**31)),
            random.randrange(2**31))


def fake_runner(resume: bool = True) -> SimpleNamespace:
    return SimpleNamespace(_resume=resume, logger=MagicMock(), seed=3, iter=8, hooks=[])


@pytest.fixture
def rank(monkeypatch):
    """Pretend to be the given rank of 2 processes."""
    def as_rank(r: int, world_size: int = 2) -> None:
        monkeypatch.setattr(module, 'get_rank', lambda: r)
        monkeypatch.setattr(module, 'get_world_size', lambda: world_size)
    state = get_rng_state()
    yield as_rank
    set_rng_state(state)  # leave the other tests' generators as they were


def warnings_of(runner) -> str:
    return ' '.join(str(call.args[0]) for call in runner.logger.warning.call_args_list)


def test_a_fresh_start_separates_every_rank_but_rank_0(rank):
    seed_rank(0, 0, 0)
    runner = fake_runner(resume=False)
    shared = get_rng_state()
    rank(0)
    RandomStateHook().before_train(runner)
    rank_0 = draws()
    set_rng_state(shared)
    assert draws() == rank_0                    # rank 0 (and a single process) unchanged
    set_rng_state(shared)
    rank(1)
    RandomStateHook().before_train(runner)
    rank_1 = draws()
    assert all(a != b for a, b in zip(rank_0, rank_1))
    seed_rank(3, 1, 8)
    assert draws() == rank_1


def test_each_rank_restores_its_own_state_from_a_checkpoint_file(rank, tmp_path):
    states = []
    for r in range(2):
        seed_rank(5, r, 0)
        states.append(get_rng_state())
    torch.save(dict(random_state={module.PER_RANK: states}), tmp_path / 'ckpt.pth')
    checkpoint = load_local_checkpoint(str(tmp_path / 'ckpt.pth'))  # weights-only, as resume
    expected = []
    for r in range(2):
        set_rng_state(states[r])
        expected.append(draws())
    for r in range(2):
        rank(r)
        runner, hook = fake_runner(), RandomStateHook()
        hook.after_load_checkpoint(runner, checkpoint)
        seed_rank(0, 0, 0)                      # whatever the Runner left
        hook.before_train(runner)
        assert draws() == expected[r]
        assert not runner.logger.warning.called


def test_an_old_single_state_checkpoint_still_resumes_a_single_process_exactly(rank):
    rank(0, world_size=1)
    state = get_rng_state()
    expected = draws()
    runner, hook = fake_runner(), RandomStateHook()
    hook.after_load_checkpoint(runner, dict(random_state=state))
    hook.before_train(runner)
    assert draws() == expected
    assert not runner.logger.warning.called


@pytest.mark.parametrize('saved', ['old', 'fewer ranks', 'rank missing', 'none on rank 0'])
def test_a_rank_without_a_saved_state_warns_and_starts_a_new_stream(rank, saved):
    state = get_rng_state()
    random_state = {'old': state, 'fewer ranks': {module.PER_RANK: [state]},
                    'rank missing': {module.PER_RANK: [state, None]},
                    'none on rank 0': None}[saved]
    r = 0 if saved == 'none on rank 0' else 1
    rank(r)
    runner, hook = fake_runner(), RandomStateHook()
    checkpoint = {} if random_state is None else dict(random_state=random_state)
    hook.after_load_checkpoint(runner, checkpoint)
    hook.before_train(runner)
    resumed = draws()
    seed_rank(3, r, 8)                          # (seed, rank, iteration of the resume)
    assert draws() == resumed
    expected = {'old': 'holds one random state', 'fewer ranks': 'random states of 1 ranks',
                'rank missing': 'no random state for ranks [1]',
                'none on rank 0': 'has no random_state'}[saved]
    assert expected in warnings_of(runner) and 'not repeat' in warnings_of(runner)


def test_rank_0_saves_every_ranks_gathered_states(rank, monkeypatch):
    rank(0)
    other = get_rng_state()
    seed_rank(1, 0, 0)
    monkeypatch.setattr(module, 'gather_object', lambda data, dst: [data, other])
    hook, runner = RandomStateHook(), fake_runner()
    hook.after_train_epoch(runner)              # every rank sends, before CheckpointHook saves
    checkpoint = {}
    hook.before_save_checkpoint(runner, checkpoint)
    saved = checkpoint['random_state'][module.PER_RANK]
    assert saved[1] is other and torch.equal(saved[0]['torch'], torch.get_rng_state())
    assert not runner.logger.warning.called

    draws()                                     # a save elsewhere, after more draws
    hook.before_save_checkpoint(runner, checkpoint)
    assert checkpoint['random_state'][module.PER_RANK][1] is None
    assert 'did not send' in warnings_of(runner)


def test_states_are_sent_every_iteration_only_when_checkpoints_are_saved_by_iteration(
        rank, monkeypatch):
    rank(0)
    sent = []
    monkeypatch.setattr(module, 'gather_object', lambda data, dst: sent.append(data) or [data])
    for by_epoch, expected in ((True, 0), (False, 1)):
        sent.clear()
        runner = fake_runner(resume=False)
        runner.hooks = [CheckpointHook(interval=2, by_epoch=by_epoch)]
        hook = RandomStateHook()
        hook.before_train(runner)
        hook.after_train_iter(runner, 0)
        assert len(sent) == expected


class StateOnTheGPU:
    """A saved generator state as ``Runner.resume`` hands it over on a GPU machine, where its
    ``map_location`` moved every tensor of the checkpoint to the GPU: torch's setters refuse
    it; only a copy back to the CPU (``.to``) gives them the bytes."""

    device = torch.device('cuda', 0)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def to(self, device=None, dtype=None) -> torch.Tensor:
        assert torch.device(device).type == 'cpu'
        return self.tensor.to(dtype=dtype)


def test_a_state_loaded_onto_the_gpu_is_restored(rank):
    seed_rank(0, 0, 0)
    saved = get_rng_state()
    expected = draws()
    mapped = dict(saved, torch=StateOnTheGPU(saved['torch']))
    set_rng_state(mapped)
    assert draws() == expected
