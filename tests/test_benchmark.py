"""tools/analysis/benchmark.py runs on the tiny model and writes a complete JSON table.

Speeds are not asserted (this machine is noisy): only that every measurement is there
and is a sane number.
"""
import json
import math
import mmap
import re

import pytest
import torch
from mmengine.config import Config

from tests.helpers import REPO, load_tool


@pytest.fixture(scope='module')
def tool():
    return load_tool('tools/analysis/benchmark.py')


def test_benchmark_tool_writes_every_measurement(tool, tmp_path, capsys):
    from mmengine.logging import MMLogger
    out = tmp_path / 'bench.json'
    logger = MMLogger.get_current_instance()
    level_before = logger.level
    tool.main(['--models', 'tiny', '--repeats', '1', '--warmup', '1', '--batch-size', 'tiny=2',
               '--pipeline-images', '2', '--out', str(out)])
    assert logger.level == level_before  # it quietens the shared logger only while it runs

    saved = json.loads(out.read_text())
    assert saved['machine']['cpus'] >= 1 and saved['device'] in ('cpu', 'cuda')
    assert saved['machine']['cpu'] and saved['machine']['cpu'] != 'unknown'
    tiny = saved['models']['tiny']
    assert tiny['batch_size'] == 2
    assert set(tiny['step_seconds']) == {'dino', 'mask_only', 'mst'}
    assert math.isclose(tiny['step_ratio'],
                        tiny['step_seconds']['mst'] / tiny['step_seconds']['dino'])
    assert math.isclose(tiny['mask_only_ratio'],
                        tiny['step_seconds']['mask_only'] / tiny['step_seconds']['dino'])
    assert set(tiny['attention_forward_seconds']) == {'without', 'with_attn'}
    assert tiny['decoder_channels'] == [32, 16]
    # Timed apart from the step, so on a busy machine the share may exceed 1: plumbing only.
    assert math.isclose(tiny['decoder_share'],
                        tiny['decoder_seconds'] / tiny['step_seconds']['mst'])
    pipeline = tiny['pipeline']
    assert set(pipeline['images_per_second']) == {'mmpretrain_default', 'mst_mm'}
    assert pipeline['views_per_image'] == 2 + 4
    assert set(tiny['peak_memory_mib']) == {'dino', 'mst'}
    numbers = [tiny['step_ratio'], tiny['attention_ratio'], tiny['decoder_share'],
               pipeline['speedup'], *tiny['peak_memory_mib'].values()]
    assert all(math.isfinite(x) and x > 0 for x in numbers)
    for name, spread in tiny['step_spread'].items():
        assert spread['min'] <= tiny['step_seconds'][name] <= spread['max']
    assert set(tiny['usage_per_step']) == {'dino', 'mask_only', 'mst'}
    for key in ('step_ratio', 'mask_only_ratio'):
        low, high = tiny[f'{key}_range_over_repetitions']
        assert low <= tiny[key] <= high
    printed = capsys.readouterr().out
    assert tool.cost_row('tiny', tiny) in printed
    verdict = saved['verdict']
    assert isinstance(verdict['quiet'], bool) and verdict['quiet'] == (not verdict['reasons'])
    assert ('QUIET: a figure that may be published' in printed) == verdict['quiet']
    assert ('NOISY, do not publish' in printed) != verdict['quiet']


def test_the_quiet_rule_takes_the_load_before_timing_and_the_spread_of_every_ratio(tool):
    def results(**times):
        return dict(models=dict(m=dict(step_spread={
            step: dict(all=all_times) for step, all_times in times.items()})))

    # The machine slows by 30 % over the run, every step alike: the ratios hold, so quiet.
    drifting = results(ref=[1.0, 1.1, 1.3], ours=[0.9, 0.99, 1.17])
    quiet = tool.quiet_verdict(0.1, drifting)
    assert quiet['quiet'] and quiet['reasons'] == [] and quiet['load_per_core_before'] == 0.1
    loaded = tool.quiet_verdict(0.9, drifting)
    assert not loaded['quiet'] and '0.90 per core' in loaded['reasons'][0]
    # ours / ref per repetition: 0.9, 1.0, 1.2 -> (1.2 - 0.9) / 1.0 = 30 %
    spread = tool.quiet_verdict(0.1, results(ref=[1.0, 1.0, 1.0], ours=[0.9, 1.0, 1.2]))
    assert spread['reasons'] == ['m ours / ref: the ratio spread over 30% of its median over '
                                 'the repetitions (at most 20%)']
    with_scaling = results(ref=[1.0, 1.0], ours=[1.0, 1.0])
    with_scaling['models']['m']['scaling'] = [dict(
        batch_size=4, num_local_crops=0,
        step_spread=dict(ref=dict(all=[1.0, 1.0, 1.0]), mst=dict(all=[1.0, 1.1, 1.25])))]
    assert tool.quiet_verdict(0.1, with_scaling)['reasons'] == [
        'm mst / ref (batch 4, 0 local crops): the ratio spread over 23% of its median over '
        'the repetitions (at most 20%)']
    assert not tool.quiet_verdict(None, drifting)['quiet']   # unknown load: not quiet
    assert tool.quiet_verdict(0.1, dict(models=dict(m=dict(skipped='no config'))))['quiet']


def test_the_variants_split_mst_into_its_mask_and_its_decoder(tool):
    variants = tool.load_variants(tool.MODELS['deit-s'][0])
    mst, mask_only, dino = (variants[k].model for k in ('mst', 'mask_only', 'dino'))
    assert mst.decoder_head is not None and mst.mask_cfg.mode == 'attention'
    assert mask_only.decoder_head is None and mask_only.mask_cfg == mst.mask_cfg
    assert dino.decoder_head is None and dino.mask_cfg.mode == 'none'
    for other in (mask_only, dino):   # nothing else differs
        assert {k: v for k, v in other.items() if k not in ('decoder_head', 'mask_cfg')} == \
            {k: v for k, v in mst.items() if k not in ('decoder_head', 'mask_cfg')}


def test_bad_batch_size_option_is_refused(tool):
    with pytest.raises(ValueError, match='MODEL=N'):
        tool.main(['--models', 'tiny', '--batch-size', 'tiny:4'])


# A stand-in for a facebookresearch/dino clone: the three modules the reference step
# imports, with DINO's names and signatures, each call written to calls.txt beside them.
STAND_IN = {
    'main_dino.py': '''
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from utils import record  # DINO's scripts import each other by top-level name


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp,
                 warmup_teacher_temp_epochs, nepochs, student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.ncrops = ncrops
        self.register_buffer('center', torch.zeros(1, out_dim))
        record(f'loss_init {out_dim} {ncrops} {teacher_temp} {student_temp}')

    def forward(self, student_output, teacher_output, epoch):
        record(f'loss {tuple(student_output.shape)} {tuple(teacher_output.shape)} '
               f'{dist.get_world_size()}')
        target = F.softmax(teacher_output.chunk(2)[0], dim=-1).detach()
        return -(target * F.log_softmax(student_output.chunk(self.ncrops)[1], -1)).sum(-1).mean()
''',
    'utils.py': '''
import os

import torch
import torch.nn as nn

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'calls.txt')


def record(line):
    with open(CALLS, 'a') as f:
        f.write(line + '\\n')


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x):
        return self.head(torch.cat([self.backbone(crop) for crop in x]))


def get_params_groups(model):
    return [{'params': [p for p in model.parameters() if p.requires_grad]}]


def clip_gradients(model, clip):
    record(f'clip {clip}')
    return []


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    record(f'cancel {epoch} {freeze_last_layer}')
''',
    'vision_transformer.py': '''
import torch.nn as nn


class VisionTransformer(nn.Module):
    def __init__(self, img_size, patch_size, embed_dim, depth, num_heads, mlp_ratio,
                 qkv_bias, norm_layer, drop_path_rate):
        super().__init__()
        self.embed_dim = embed_dim
        self.patch = nn.Conv2d(3, embed_dim, patch_size, patch_size)

    def forward(self, x):
        return self.patch(x).mean(dim=(2, 3))


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, use_bn=False, norm_last_layer=True, nlayers=3,
                 hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        self.mlp = nn.Linear(in_dim, out_dim)

    def forward(self, x):
        return self.mlp(x)
''',
}


def stand_in_dino(folder):
    folder.mkdir()
    for name, text in STAND_IN.items():
        (folder / name).write_text(text)
    return folder


def test_reference_dino_option_times_the_three_steps_from_the_clone(tool, tmp_path, capsys):
    clone = stand_in_dino(tmp_path / 'dino')
    out = tmp_path / 'reference.json'
    # a config path, not a built-in name
    config = 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py'
    tool.main(['--reference-dino', str(clone), '--models', config, '--repeats', '2',
               '--warmup', '1', '--batch-size', '2', '--threads', '1', '--out', str(out)])

    result = json.loads(out.read_text())['models'][config]
    assert set(result['step_seconds']) == {'reference_dino', 'dino_mode', 'mst'}
    seconds = result['step_seconds']
    assert math.isclose(result['dino_mode_speed_vs_reference'],
                        seconds['reference_dino'] / seconds['dino_mode'])
    assert math.isclose(result['mst_speed_vs_reference'],
                        seconds['reference_dino'] / seconds['mst'])
    assert math.isclose(result['mst_over_dino_mode'], seconds['mst'] / seconds['dino_mode'])
    for name, spread in result['step_spread'].items():
        assert len(spread['all']) == 2 and spread['min'] <= seconds[name] <= spread['max']
    assert set(result['peak_memory_mib']) == {'reference_dino', 'dino_mode', 'mst'}
    assert all(math.isfinite(v) for v in result['peak_memory_mib'].values())
    assert result['crops'] == '2 x 32 + 4 x 16 px' and result['out_channels'] == 1024
    for used in result['usage_per_step'].values():
        assert set(used) == {'user', 'system', 'minor_faults'} and min(used.values()) >= 0
    assert set(result['usage_per_step']) == {'reference_dino', 'dino_mode', 'mst'}
    assert result['amp'] is False

    calls = (clone / 'calls.txt').read_text().splitlines()
    # Built with the config's K, crops and temperatures; one step per warm-up and timed
    # repetition here, one whose operations are counted, plus two in the memory probe; each
    # step clips and cancels.
    head = Config.fromfile(str(REPO / config)).model.head
    assert calls[0] == f'loss_init 1024 6 {head.teacher_temp} {head.student_temp}'
    steps = [c for c in calls if c.startswith('loss ')]
    assert len(steps) == 1 + 2 + 1 + 2
    assert steps[0] == 'loss (12, 1024) (4, 1024) 1'   # 6 crops x 2 images; 2 global x 2
    assert calls.count('clip 3.0') == len(steps) and calls.count('cancel 0 0') == len(steps)
    flops = result['gflops_per_image']
    assert flops['reference_dino'] > 0 and flops['mst'] > flops['dino_mode'] > 0  # + decoder
    for name, images in result['images_per_second'].items():
        assert math.isclose(images, 2 / seconds[name])
    printed = capsys.readouterr().out
    assert '| reference_dino |' in printed and 'MST / DINO mode' in printed
    assert 'our DINO mode, speed against the reference' in printed
    saved = json.loads(out.read_text())
    row = tool.reference_summary_row(saved, config)
    assert f'{config}: {row}' in printed
    low, high = result['ratio_range_over_repetitions']['mst_over_dino_mode']
    assert row.startswith('| 1 | ') and f'{result["mst_over_dino_mode"]:.3f} ({low:.3f}-' in row
    assert row.endswith(' | quiet |' if saved['verdict']['quiet'] else ' | NOISY |')


def test_scaling_times_the_three_steps_at_every_batch_and_local_crop_count(tool, tmp_path,
                                                                          capsys):
    clone = stand_in_dino(tmp_path / 'dino')
    out = tmp_path / 'scaling.json'
    config = 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py'
    tool.main(['--reference-dino', str(clone), '--models', config, '--repeats', '1',
               '--warmup', '1', '--batch-size', '2', '--threads', '1', '--skip-memory',
               '--scaling', '--out', str(out)])
    saved = json.loads(out.read_text())
    points = saved['models'][config]['scaling']
    assert [(p['batch_size'], p['num_local_crops']) for p in points] == list(
        tool.SCALING_POINTS)
    for point in points:
        spread = point['step_spread']
        assert set(spread) == {'reference_dino', 'dino_mode', 'mst'}
        assert math.isclose(point['mst_over_dino_mode'],
                            spread['mst']['median'] / spread['dino_mode']['median'])
    # DINO's loss was built for each point's crop count: 2 global + the local crops.
    inits = [c for c in (clone / 'calls.txt').read_text().splitlines()
             if c.startswith('loss_init')]
    assert [int(c.split()[2]) for c in inits] == [6] + [2 + n for _, n in tool.SCALING_POINTS]
    printed = capsys.readouterr().out
    assert '| 16 | 8 |' in printed and '| 4 | 0 |' in printed
    assert isinstance(saved['verdict']['quiet'], bool)


def test_usage_counts_the_pages_each_step_touches_first(tool):
    size = 64 * 2**20

    def touch_64_mib():   # a fresh anonymous mapping: every page is new to the process
        with mmap.mmap(-1, size) as fresh:
            for offset in range(0, size, 4096):
                fresh[offset] = 1

    usage = {}
    times = tool.interleaved_times(dict(touch=touch_64_mib, idle=lambda: None), 3, 1, 'cpu',
                                   usage)
    assert [len(t) for t in times.values()] == [3, 3] and set(usage) == {'touch', 'idle'}
    # 16,384 pages of 4 KiB, or 32 huge pages where the kernel backs them so
    assert min(u['minor_faults'] for u in usage['touch']) >= 32
    assert min(u['minor_faults'] for u in usage['touch']) > \
        max(u['minor_faults'] for u in usage['idle'])
    assert all(u['user'] >= 0 and u['system'] >= 0 for reps in usage.values() for u in reps)


def test_flops_of_counts_forward_and_backward_of_a_step(tool):
    x = torch.randn(8, 32)
    weight = torch.randn(16, 32, requires_grad=True)
    # forward 2*8*32*16; backward: the weight's gradient only (x needs none), as much again
    assert tool.flops_of(lambda: (x @ weight.t()).sum().backward()) == 2 * (2 * 8 * 32 * 16)
    # fused attention too: two (16 x 16 x 8) products per head forward, twice that backward
    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    attention = torch.nn.functional.scaled_dot_product_attention
    assert tool.flops_of(lambda: attention(q, q, q).sum().backward()) == 3 * (
        2 * 2 * (2 * 16 * 16 * 8))


def test_reference_dino_option_names_what_the_folder_lacks(tool, tmp_path):
    (tmp_path / 'main_dino.py').write_text('')
    with pytest.raises(FileNotFoundError, match='lacks utils.py, vision_transformer.py'):
        tool.main(['--reference-dino', str(tmp_path), '--models', 'tiny', '--skip-memory',
                   '--out', str(tmp_path / 'x.json')])


def test_models_accepts_built_in_names_and_config_paths_only(tool):
    assert tool.resolve_model('deit-s')[0].endswith('mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py')
    with pytest.raises(ValueError, match='built-in names'):
        tool.main(['--models', 'no-such-model', '--skip-memory'])


def test_every_option_has_a_help_text(tool):
    parser_actions = tool.build_parser()._actions
    undocumented = [a.dest for a in parser_actions
                    if a.help is None and a.dest not in ('help',)]
    assert undocumented == []


def test_published_speed_figures_are_the_committed_quiet_runs(tool):
    """docs/benchmarks.md quotes each committed run as the tool prints it, and nothing else."""
    doc = (REPO / 'docs' / 'benchmarks.md').read_text()
    runs = sorted((REPO / 'docs' / 'results' / 'benchmarks').glob('*.json'))
    linked = set(re.findall(r'\(results/benchmarks/([\w.-]+)\.json\)', doc))
    assert linked == {run.stem for run in runs}
    for run in runs:
        results = json.loads(run.read_text())
        assert results['verdict']['quiet'], f'{run.name} is a noisy run'
        assert not results['commit'].endswith('+dirty'), f'{run.name} timed uncommitted code'
        for name, result in results['models'].items():
            if 'step_ratio' in result:   # the cost of MST over DINO, piece by piece
                assert tool.cost_row(name, result) in doc
                continue
            row = tool.reference_summary_row(results, name)
            assert f'| [{run.stem}](results/benchmarks/{run.stem}.json) {row}' in doc
            if 'scaling' in result:
                assert '\n'.join(tool.scaling_rows(result)) in doc
