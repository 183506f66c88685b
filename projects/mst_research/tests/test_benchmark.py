"""projects/mst_research/tools/benchmark.py and the kit's modules behind it (mst_research.bench,
step_cost, dino_reference): the interleaved timing, the ratios and their spread, the FLOP
count, the reference DINO step built from a DINO clone, and the rows docs/benchmarks.md quotes.

Speeds are never asserted (this machine is noisy). The end-to-end runs replace the timer by
one that runs every step once and returns known seconds, so that every published figure
can be checked against a computation by hand.
"""
import json
import mmap
import re
import sys
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from kit_helpers import DEMO_CONFIG, REPO, cpu_mixed_precision_training, load_tool, stand_in_dino
from mmengine.config import Config

from mst_research import bench, dino_reference, step_cost

# seconds of three repetitions; the hand-computed figures below come from these
KNOWN_SECONDS = dict(
    dino=[1.0, 2.0, 4.0], mask_only=[1.1, 2.0, 4.0], mst=[1.2, 2.2, 4.8],
    without=[0.5, 0.5, 0.5], with_attn=[0.51, 0.5, 0.52], decoder=[0.11, 0.22, 0.33],
    reference_dino=[1.5, 2.6, 4.0], dino_mode=[1.0, 2.0, 4.0],
    float32=[1.1, 2.0, 4.2], autocast=[1.0, 2.0, 4.0])
KNOWN_USAGE = [dict(user=0.9, system=0.2, minor_faults=300),
               dict(user=1.0, system=0.1, minor_faults=100),
               dict(user=3.0, system=0.3, minor_faults=200)]


@pytest.fixture(scope='module')
def tool():
    return load_tool('projects/mst_research/tools/benchmark.py')


@pytest.fixture
def known_timer(monkeypatch):
    """Every step really runs once; its seconds and usage are ``KNOWN_*``."""
    def interleaved_times(fns, repeats, warmup, device):
        for fn in fns.values():
            fn()
        return ({name: KNOWN_SECONDS[name] for name in fns},
                {name: KNOWN_USAGE for name in fns})

    monkeypatch.setattr(bench, 'interleaved_times', interleaved_times)
    monkeypatch.setattr(bench, 'load_per_core', lambda: 0.25)


def test_cost_run_reports_the_ratios_their_spread_and_the_load(tool, known_timer, tmp_path,
                                                               capsys):
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level_before = logger.level
    out = tmp_path / 'cost.json'
    tool.main(['--models', 'tiny', '--batch-size', '2', '--out', str(out)])
    assert logger.level == level_before  # it quietens the shared logger only while it runs

    saved = json.loads(out.read_text())
    tiny = saved['models']['tiny']
    assert saved['load_per_core_before'] == 0.25 and tiny['batch_size'] == 2
    assert saved['machine']['cpu'] and saved['machine']['cpus'] >= 1
    # MST / DINO: medians 2.2 / 2.0; per repetition 1.2, 1.1, 1.2
    assert tiny['step_ratio'] == pytest.approx(1.1)
    assert tiny['step_ratio_range_over_repetitions'] == pytest.approx([1.1, 1.2])
    # mask only / DINO: medians 2.0 / 2.0; per repetition 1.1, 1.0, 1.0
    assert tiny['mask_only_ratio'] == pytest.approx(1.0)
    assert tiny['mask_only_ratio_range_over_repetitions'] == pytest.approx([1.0, 1.1])
    assert tiny['step_spread']['mst'] == dict(median=2.2, min=1.2, max=4.8,
                                              spread=pytest.approx(3.6 / 2.2), all=[1.2, 2.2, 4.8])
    assert tiny['attention_ratio'] == pytest.approx(0.51 / 0.5)
    assert tiny['decoder_share'] == pytest.approx(0.22 / 2.2)
    assert tiny['decoder_channels'] == [32, 16]
    assert tiny['usage_per_step']['mst'] == dict(user=1.0, system=0.2, minor_faults=200)
    printed = capsys.readouterr().out
    assert '1-minute load average per core before timing: 0.25' in printed
    assert ('| tiny | 2 | 2.000 (1.000-4.000) | 2.200 (1.200-4.800) | 1.100 (1.100-1.200) '
            '| 1.000 (1.000-1.100) | 1.020 | 10.0% | 0.25 |') in printed


def test_interleaved_times_rotates_the_order_every_repetition():
    calls = []
    times, usage = bench.interleaved_times(
        {name: partial(calls.append, name) for name in 'abc'}, 3, 1, 'cpu')
    assert calls == list('abc' 'abc' 'bca' 'cab')   # one warm-up each, then rotated
    assert {name: len(t) for name, t in times.items()} == dict(a=3, b=3, c=3)
    assert all(t >= 0 for reps in times.values() for t in reps)


def test_usage_counts_the_pages_each_step_touches_first():
    size = 64 * 2**20

    def touch_64_mib():   # a fresh anonymous mapping: every page is new to the process
        with mmap.mmap(-1, size) as fresh:
            for offset in range(0, size, 4096):
                fresh[offset] = 1

    _, usage = bench.interleaved_times(dict(touch=touch_64_mib, idle=lambda: None), 3, 1, 'cpu')
    # 16,384 pages of 4 KiB, or 32 huge pages where the kernel backs them so
    assert min(u['minor_faults'] for u in usage['touch']) >= 32
    assert min(u['minor_faults'] for u in usage['touch']) > \
        max(u['minor_faults'] for u in usage['idle'])
    assert all(u['user'] >= 0 and u['system'] >= 0 for reps in usage.values() for u in reps)


def test_the_variants_split_mst_into_its_mask_and_its_decoder():
    variants = step_cost.load_variants(step_cost.resolve_model('deit-s')[0])
    mst, mask_only, dino = (variants[k].model for k in ('mst', 'mask_only', 'dino'))
    assert mst.decoder_head is not None and mst.mask_cfg.mode == 'attention'
    assert mask_only.decoder_head is None and mask_only.mask_cfg == mst.mask_cfg
    assert dino.decoder_head is None and dino.mask_cfg.mode == 'none'
    for other in (mask_only, dino):   # nothing else differs
        assert {k: v for k, v in other.items() if k not in ('decoder_head', 'mask_cfg')} == \
            {k: v for k, v in mst.items() if k not in ('decoder_head', 'mask_cfg')}


def test_reference_dino_option_times_the_three_steps_from_the_clone(tool, known_timer,
                                                                    tmp_path, capsys):
    clone = stand_in_dino(tmp_path / 'dino')
    out = tmp_path / 'reference.json'
    config = 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py'  # a path, not a name
    path_before = list(sys.path)
    tool.main(['--reference-dino', str(clone), '--models', config, '--batch-size', '2',
               '--threads', '1', '--out', str(out)])

    # The clone's modules were loaded from their files: sys.path and sys.modules are as before.
    assert sys.path == path_before and 'main_dino' not in sys.modules
    saved = json.loads(out.read_text())
    result = saved['models'][config]
    # reference / ours: medians 2.6 / 2.0 and 2.6 / 2.2; per repetition 1.5, 1.3, 1.0 and
    # 1.25, 1.18, 0.83; MST / DINO mode: 2.2 / 2.0, per repetition 1.2, 1.1, 1.2
    assert result['dino_mode_speed_vs_reference'] == pytest.approx(1.3)
    assert result['mst_speed_vs_reference'] == pytest.approx(2.6 / 2.2)
    assert result['mst_over_dino_mode'] == pytest.approx(1.1)
    ranges = result['ratio_range_over_repetitions']
    assert ranges['dino_mode_speed'] == pytest.approx([1.0, 1.5])
    assert ranges['mst_speed'] == pytest.approx([4.0 / 4.8, 1.25])
    assert ranges['mst_over_dino_mode'] == pytest.approx([1.1, 1.2])
    assert result['images_per_second'] == pytest.approx(
        dict(reference_dino=2 / 2.6, dino_mode=2 / 2.0, mst=2 / 2.2))
    assert result['crops'] == '2 x 32 + 4 x 16 px' and result['out_channels'] == 1024
    assert result['amp'] is False and result['dtypes'] is None
    assert result['peak_memory_gib'] == dict(reference_dino=None, dino_mode=None, mst=None)
    flops = result['gflops_per_image']
    assert flops['reference_dino'] > 0 and flops['mst'] > flops['dino_mode'] > 0  # + decoder
    row = '| 1 | 1.300 (1.000-1.500) | 1.182 (0.833-1.250) | 1.100 (1.100-1.200) | 0.25 |'
    assert dino_reference.reference_summary_row(saved, config) == row
    assert f'{config}: {row}' in capsys.readouterr().out

    calls = (clone / 'calls.txt').read_text().splitlines()
    # Built with the config's K, crops and temperatures; one step timed, one counted; each
    # step clips with the config's max norm and cancels nothing at epoch 0.
    head = Config.fromfile(DEMO_CONFIG).model.head
    assert calls[0] == f'loss_init 1024 6 {head.teacher_temp} {head.student_temp}'
    steps = [c for c in calls if c.startswith('loss ')]
    assert steps == ['loss (12, 1024) (4, 1024) 1'] * 2   # 6 crops x 2 images; 2 global x 2
    assert calls.count('clip 3.0') == 2 and calls.count('cancel 0 0') == 2


def test_flops_of_counts_forward_and_backward_of_a_step():
    x = torch.randn(8, 32)
    weight = torch.randn(16, 32, requires_grad=True)
    # forward 2*8*32*16; backward: the weight's gradient only (x needs none), as much again
    assert bench.flops_of(lambda: (x @ weight.t()).sum().backward()) == 2 * (2 * 8 * 32 * 16)
    # fused attention too: two (16 x 16 x 8) products per head forward, twice that backward
    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    attention = torch.nn.functional.scaled_dot_product_attention
    assert bench.flops_of(lambda: attention(q, q, q).sum().backward()) == 3 * (
        2 * 2 * (2 * 16 * 16 * 8))


def test_reference_dino_option_names_what_the_folder_lacks(tmp_path):
    (tmp_path / 'main_dino.py').write_text('')
    with pytest.raises(FileNotFoundError, match='lacks utils.py, vision_transformer.py'):
        dino_reference.import_reference_dino(str(tmp_path))


def test_models_accepts_built_in_names_and_config_paths_only(tool):
    assert step_cost.resolve_model('deit-s')[0].endswith(
        'mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
    assert step_cost.resolve_model(DEMO_CONFIG) == (DEMO_CONFIG, step_cost.DEFAULT_BATCH_SIZE)
    with pytest.raises(ValueError, match='built-in names'):
        tool.main(['--models', 'no-such-model'])


def test_every_option_has_a_help_text(tool):
    undocumented = [a.dest for a in tool.build_parser()._actions
                    if a.help is None and a.dest != 'help']
    assert undocumented == []


def test_published_speed_figures_are_the_committed_runs_as_the_tool_renders_them():
    """docs/benchmarks.md quotes each committed run as the tool prints it, and nothing else."""
    doc = (REPO / 'docs' / 'benchmarks.md').read_text()
    runs = sorted((REPO / 'docs' / 'results' / 'benchmarks').glob('*.json'))
    linked = set(re.findall(r'\(results/benchmarks/([\w.-]+)\.json\)', doc))
    assert linked == {run.stem for run in runs}
    for run in runs:
        results = json.loads(run.read_text())
        assert not results['commit'].endswith('+dirty'), f'{run.name} timed uncommitted code'
        for name, result in results['models'].items():
            if 'step_ratio' in result:   # the cost of MST over DINO, piece by piece
                assert step_cost.cost_row(results, name) in doc
            elif 'float32_over_autocast' in result:   # --prototype-precision
                row = step_cost.prototype_row(results, name)
                assert f'| [{run.stem}](results/benchmarks/{run.stem}.json) {row}' in doc
            else:
                row = dino_reference.reference_summary_row(results, name)
                assert f'| [{run.stem}](results/benchmarks/{run.stem}.json) {row}' in doc


def test_dtypes_time_our_steps_once_per_autocast_dtype(tool):
    assert dino_reference.our_step_names(None) == dict(dino_mode=('dino', None),
                                                       mst=('mst', None))
    assert dino_reference.our_step_names(['bfloat16', 'float16']) == dict(
        dino_mode_bfloat16=('dino', 'bfloat16'), mst_bfloat16=('mst', 'bfloat16'),
        dino_mode_float16=('dino', 'float16'), mst_float16=('mst', 'float16'))
    assert dino_reference.reference_ratios(None) == dino_reference.REFERENCE_RATIOS
    ratios = dino_reference.reference_ratios(['bfloat16'])
    assert ratios == dict(
        dino_mode_speed_vs_reference_bfloat16=('reference_dino', 'dino_mode_bfloat16'),
        mst_speed_vs_reference_bfloat16=('reference_dino', 'mst_bfloat16'),
        mst_over_dino_mode_bfloat16=('mst_bfloat16', 'dino_mode_bfloat16'))
    with pytest.raises(ValueError, match='--dtypes .* needs --reference-dino and AMP'):
        tool.main(['--models', 'tiny', '--device', 'cpu', '--dtypes', 'bfloat16'])


def test_state_bytes_counts_what_a_step_keeps_once():
    model = torch.nn.Linear(4, 3)                      # 12 + 3 float32
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()                                   # exp_avg, exp_avg_sq, step per param
    inputs = torch.zeros(5)
    view = inputs[1:]                                  # the same storage: counted once
    expected = 4 * (15 + 15 + 2 * 15) + 2 * 4 + 4 * 5  # weights, grads, moments, steps, input
    assert bench.state_bytes([model], [optimizer], [inputs, view]) == expected
    assert bench.peak_memory_gib(lambda: None, expected, 'cpu') is None   # CUDA only


def test_reference_table_names_each_steps_autocast_and_peak_memory(capsys):
    steps = ('reference_dino', 'dino_mode_bfloat16', 'mst_bfloat16')
    result = dict(batch_size=128, crops='2 x 224 + 10 x 96 px', out_channels=65536, amp=True,
                  dtypes=dict(dino_mode_bfloat16='bfloat16', mst_bfloat16='bfloat16'),
                  step_seconds=dict(zip(steps, (0.5, 0.4, 0.45))),
                  images_per_second=dict(zip(steps, (256.0, 320.0, 284.4))),
                  gflops_per_image=dict(zip(steps, (60.0, 60.0, 70.0))),
                  peak_memory_gib=dict(zip(steps, (20.0, 18.5, 21.25))),
                  step_spread={s: dict(median=t, min=t, max=t) for s, t in
                               zip(steps, (0.5, 0.4, 0.45))},
                  usage_per_step={s: dict(user=1.0, system=0.1, minor_faults=10) for s in steps})
    dino_reference.print_reference_table(dict(peak_tflops=989.0, repeats=5,
                                              models={'deit-s': result}))
    printed = capsys.readouterr().out
    # speed against the reference 0.5 / 0.4; MFU 320 images/s x 60 GFLOP / 989 TFLOP/s
    assert ('| dino_mode_bfloat16 | bfloat16 | 0.400 (0.400-0.400) | 1.250 | 320.0 | 60.0 '
            '| 1.9% | 18.50 |') in printed
    assert '| reference_dino | float16 | 0.500 (0.500-0.500) | 1.000 |' in printed
    assert 'docs/benchmarks.md row' not in printed   # the docs' rows have no --dtypes


@cpu_mixed_precision_training
def test_dtypes_build_and_time_our_steps_in_each_autocast_dtype(tmp_path, monkeypatch):
    """--dtypes on a GPU, here on the CPU: mmengine's AMP wrapper with its GPU assertion
    lifted and torch's CPU GradScaler (as tests/test_engine/test_mixed_precision.py does)."""
    import functools

    from mmengine.optim.optimizer import amp_optimizer_wrapper
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(amp_optimizer_wrapper, 'GradScaler',
                        functools.partial(torch.amp.GradScaler, 'cpu'))

    def one_call_each(fns, repeats, warmup, device):
        for fn in fns.values():
            fn()
        return ({name: [1.0] for name in fns},
                {name: [dict(user=1.0, system=0.0, minor_faults=1)] for name in fns})

    monkeypatch.setattr(bench, 'interleaved_times', one_call_each)
    variants = step_cost.load_variants(DEMO_CONFIG)
    for dtype in ('bfloat16', 'float16'):
        _, wrapper = step_cost.build_for_training(variants['mst'], 'cpu', amp=True, dtype=dtype)
        assert wrapper.cast_dtype == getattr(torch, dtype)
    # mmengine's CPU autocast takes bfloat16 only: one dtype here, named as on the GPU.
    clone = stand_in_dino(tmp_path / 'dino')
    result = dino_reference.compare_with_reference(DEMO_CONFIG, str(clone), 2, 1, 0, 'cpu',
                                                   True, ['bfloat16'])
    assert result['dtypes'] == dict(dino_mode_bfloat16='bfloat16', mst_bfloat16='bfloat16')
    assert list(result['step_seconds']) == ['reference_dino', 'dino_mode_bfloat16',
                                            'mst_bfloat16']
    flops = result['gflops_per_image']
    assert flops['mst_bfloat16'] > flops['dino_mode_bfloat16'] > 0   # + the decoder
    assert result['mst_over_dino_mode_bfloat16'] == 1.0   # the stand-in timer's seconds
    assert set(result['ratio_range_over_repetitions']) == {
        'dino_mode_speed_bfloat16', 'mst_speed_bfloat16', 'mst_over_dino_mode_bfloat16'}
    assert result['peak_memory_gib'] == dict.fromkeys(result['step_seconds'])  # CPU: None


@cpu_mixed_precision_training
def test_prototype_precision_times_the_float32_layer_against_autocast(tool, known_timer,
                                                                      tmp_path, monkeypatch,
                                                                      capsys):
    """Both steps run under CPU bfloat16 autocast, the baseline with the prototype layer's
    logits in bfloat16; the layer's FLOP share is its 2 B C K per view (forward), three times
    for the student's views (with the backward), over the counted step."""
    seen = []
    build = step_cost.build_for_training

    def recording_build(*args, **kwargs):
        model, wrapper = build(*args, **kwargs)
        model.neck.last_layer.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        return model, wrapper

    monkeypatch.setattr(step_cost, 'build_for_training', recording_build)
    out = tmp_path / 'precision.json'
    tool.main(['--models', 'tiny', '--batch-size', '2', '--prototype-precision', 'bfloat16',
               '--out', str(out)])
    tiny = json.loads(out.read_text())['models']['tiny']
    # medians 2.0 / 2.0; per repetition 1.1, 1.0, 1.05
    assert tiny['float32_over_autocast'] == pytest.approx(1.0)
    assert tiny['float32_over_autocast_range'] == pytest.approx([1.0, 1.1])
    # The student's logits: the float32 step, the autocast step, the float32 step counted.
    assert seen == [torch.float32, torch.bfloat16, torch.float32]
    assert 0 < tiny['prototype_layer_flop_share'] < 0.05
    assert '| tiny | 2 | bfloat16 |' in capsys.readouterr().out
    assert step_cost.prototype_row(json.loads(out.read_text()), 'tiny').startswith('| tiny | 2 |')
    with pytest.raises(ValueError, match='float16 needs --device cuda'):
        tool.main(['--models', 'tiny', '--prototype-precision', 'float16', '--out', str(out)])


def test_the_math_backend_computes_attention_by_the_book():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    with bench.math_attention():
        out = F.scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1) @ v
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
