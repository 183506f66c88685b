"""The kit's tools/benchmark_loader.py and mst_research.loader_speed: the per-image worker
pipelines and the figures' keys."""
import json
from pathlib import Path

import numpy as np
from kit_helpers import REPO, load_tool
from mmengine.config import Config

from mst_research import loader_speed

REPO_PATH = Path(REPO)


def test_the_worker_pipeline_only_cuts_while_the_old_one_augments(tmp_path):
    cfg = Config.fromfile(f'{REPO}/{loader_speed.CONFIG}')
    paths = loader_speed.write_photos(str(tmp_path / 'photos'), 2)
    fns = loader_speed.worker_pipelines(cfg, None)
    np.random.seed(0)
    ours = fns['ours'](paths[0])['inputs']
    assert [tuple(v.shape) for v in ours] == [(3, 224, 224)] * 2 + [(3, 96, 96)] * 8
    # With the same draws the crops are the same; the full pipeline then changes them.
    np.random.seed(0)
    whole = fns['ours_per_image'](paths[0])['inputs']
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(ours, whole))


def test_one_quick_run_writes_every_figure(tmp_path):
    out = tmp_path / 'loader.json'
    tool = load_tool('projects/mst_research/tools/benchmark_loader.py')
    tool.main(['--images', '2', '--repeats', '1', '--batch-size', '2', '--device', 'cpu',
               '--workers', '0', '--batches', '1', '--photos', str(tmp_path / 'photos'),
               '--out', str(out)])
    results = json.loads(out.read_text())
    assert set(results['per_image']['cpu_ms_per_image']) == {'ours', 'ours_per_image'}
    assert results['per_image']['ratios']['ours_per_image_over_ours']['median'] > 0
    assert results['device_side']['median'] > 0
    assert results['loader'][0]['workers'] == 0 and results['loader'][0]['images_per_second'] > 0


def test_the_docs_and_readme_give_the_committed_runs_figures():
    runs = sorted((REPO_PATH / 'docs/results/loader_speed').glob('*.json'))
    assert runs, 'no committed run of projects/mst_research/tools/benchmark_loader.py'
    docs = (REPO_PATH / 'docs/benchmarks.md').read_text()
    readme = (REPO_PATH / 'README.md').read_text()
    lows, highs = [], []
    for path in runs:
        results = json.loads(path.read_text())
        assert results['command'] in docs, path.name
        for row in loader_speed.markdown_rows(results):
            assert row in docs, (path.name, row)
        ratio = results['per_image']['ratios']['dino_over_ours']
        lows.append(ratio['median'])
        highs.append(ratio['median'])
    span = (f'{min(lows):.1f}x' if f'{min(lows):.1f}' == f'{max(highs):.1f}'
            else f'{min(lows):.1f}-{max(highs):.1f}x')
    assert f'{span} less CPU time per image than DINO' in readme
