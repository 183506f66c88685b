"""projects/mst_research/tools/memory_per_image.py (and mst_research.step_cost's fit): the
straight line through the peaks, one real run, and the docs' figures read off the committed run."""
import json

import pytest
from kit_helpers import REPO, load_tool

from mst_research.step_cost import fit_memory_per_image


@pytest.fixture(scope='module')
def tool():
    return load_tool('projects/mst_research/tools/memory_per_image.py')


def test_the_fit_recovers_a_planted_line():
    rows = [dict(batch_size=b, peak=1900.0 + 275.0 * b) for b in (2, 4, 8, 16)]
    fit = fit_memory_per_image(rows)
    assert fit['mib_per_image'] == pytest.approx(275.0)
    assert fit['fixed_mib'] == pytest.approx(1900.0)
    assert fit_memory_per_image(rows[:1]) is None


@pytest.mark.slow
def test_a_run_of_the_tiny_config_grows_with_the_batch(tool, tmp_path):
    out = tmp_path / 'memory.json'
    results = tool.main(['configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py',
                         '--batch-sizes', '4', '32', '--out', str(out)])
    assert json.loads(out.read_text()) == results
    assert [r['batch_size'] for r in results['rows']] == [4, 32]
    assert results['rows'][1]['peak'] > results['rows'][0]['peak']
    assert results['fit']['mib_per_image'] > 0


def test_the_docs_state_the_committed_run():
    fit = json.loads((REPO / 'docs/results/memory/deit-s_cpu.json').read_text())['fit']
    docs = ' '.join((REPO / 'docs/benchmarks.md').read_text().split())
    assert (f"{fit['mib_per_image']:.0f} MiB per image and {fit['fixed_mib']:.0f} MiB fixed"
            in docs)
    at_128 = (fit['fixed_mib'] + 128 * fit['mib_per_image']) / 1024
    assert f'{at_128:.0f} GiB in float32' in docs
