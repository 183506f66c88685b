"""tools/analysis/benchmark.py runs on the tiny model and writes a complete JSON table.

Speeds are not asserted (this machine is noisy): only that every measurement is there
and is a sane number.
"""
import json
import math

import pytest

from tests.helpers import load_tool


@pytest.fixture(scope='module')
def tool():
    return load_tool('tools/analysis/benchmark.py')


def test_benchmark_tool_writes_every_measurement(tool, tmp_path, capsys):
    out = tmp_path / 'bench.json'
    tool.main(['--models', 'tiny', '--repeats', '1', '--warmup', '1', '--batch-size', 'tiny=2',
               '--pipeline-images', '2', '--out', str(out)])

    saved = json.loads(out.read_text())
    assert saved['machine']['cpus'] >= 1 and saved['device'] in ('cpu', 'cuda')
    tiny = saved['models']['tiny']
    assert tiny['batch_size'] == 2
    assert set(tiny['step_seconds']) == {'dino', 'mst'}
    assert math.isclose(tiny['step_ratio'],
                        tiny['step_seconds']['mst'] / tiny['step_seconds']['dino'])
    assert set(tiny['attention_forward_seconds']) == {'without', 'with_attn'}
    assert tiny['decoder_channels'] == [32, 16] and 0 < tiny['decoder_share'] < 1
    pipeline = tiny['pipeline']
    assert set(pipeline['images_per_second']) == {'mmpretrain_default', 'mst_mm'}
    assert pipeline['views_per_image'] == 2 + 4
    assert set(tiny['peak_memory_mib']) == {'dino', 'mst'}
    numbers = [tiny['step_ratio'], tiny['attention_ratio'], pipeline['speedup'],
               *tiny['peak_memory_mib'].values()]
    assert all(math.isfinite(x) and x > 0 for x in numbers)
    assert '| tiny | 2 |' in capsys.readouterr().out


def test_bad_batch_size_option_is_refused(tool):
    with pytest.raises(ValueError, match='MODEL=N'):
        tool.main(['--models', 'tiny', '--batch-size', 'tiny:4'])
