"""projects/mst_research/tools/benchmark_recipe.py and mst_research.recipe_speed: the split
of an iteration, the ratios taken inside a repetition, one real run, the recipe each
checkout's runs import, and the docs rows rendered from the committed JSONs."""
import json
import os
import re
import statistics

import pytest
from kit_helpers import REPO, load_tool

from mst_research import recipe_speed
from mst_research.data import write_object_images


@pytest.fixture(scope='module')
def tool():
    return load_tool('projects/mst_research/tools/benchmark_recipe.py')


def test_an_iteration_splits_into_loader_preprocess_step_and_hooks():
    # Two iterations after a first one that ended at t = 1.0 (seconds).
    stamps = [dict(start=0.2, end=1.0, step=0.7, preprocess=0.1),
              dict(start=1.3, end=2.5, step=1.0, preprocess=0.25),
              dict(start=2.6, end=3.2, step=0.5, preprocess=0.0)]
    parts = recipe_speed.split_iterations(stamps)
    expected = dict(loader=[0.3, 0.1], preprocess=[0.25, 0.0], step=[0.75, 0.5],
                    hooks=[0.2, 0.1], total=[1.5, 0.7])
    for name, values in expected.items():
        assert parts[name] == pytest.approx(values), name


def test_ratios_are_taken_inside_each_repetition():
    speeds = {('baseline', 'dino'): [100, 80], ('baseline', 'mst_guided_mask'): [70, 60],
              ('this', 'dino'): [150, 160], ('this', 'mst_guided_mask'): [105, 96]}
    runs = [dict(code=code, variant=variant, repeat=i, images_per_s=v,
                 ms={p: 1.0 for p in (*recipe_speed.PARTS, 'total')}, mfu=v / 1000,
                 flop_per_image=1e8, peak_gflops=90.0)
            for (code, variant), values in speeds.items() for i, v in enumerate(values)]
    ratios = recipe_speed.summarise(runs, ['baseline', 'this'])['ratios']
    dino = ratios['dino: this / baseline images/s']
    # Per repetition 1.5 and 2.0, not the ratio of the medians (155 / 90 = 1.72).
    assert (dino['min'], dino['max'], dino['median']) == pytest.approx((1.5, 2.0, 1.75))
    assert ratios['this: mst / dino images/s']['max'] == pytest.approx(0.7)


def test_each_checkout_runs_with_its_own_code_and_recipe(tmp_path):
    env, recipe = recipe_speed.checkout_env(str(REPO))
    assert recipe == 'mst_research.recipes'
    assert env['PYTHONPATH'].split(os.pathsep)[:2] == [str(REPO),
                                                       str(REPO / 'projects' / 'mst_research')]
    assert env['OMP_NUM_THREADS'] == '1'
    # A checkout from before the kit (e.g. 4fb79cc): its tools/evidence.py is the recipe.
    (tmp_path / 'old' / 'tools').mkdir(parents=True)
    (tmp_path / 'old' / 'tools' / 'evidence.py').write_text('')
    env, recipe = recipe_speed.checkout_env(str(tmp_path / 'old'))
    assert recipe == 'evidence'
    assert env['PYTHONPATH'].split(os.pathsep)[:2] == [str(tmp_path / 'old'),
                                                       str(tmp_path / 'old' / 'tools')]
    with pytest.raises(SystemExit, match='not a checkout of this project'):
        recipe_speed.checkout_env(str(tmp_path))


@pytest.mark.slow
def test_one_run_of_this_code_times_both_variants_and_counts_their_flop(tool, tmp_path,
                                                                        small_package):
    data_root = tmp_path / 'animals'
    write_object_images(str(data_root / 'objects'), test_per_class=1, package_dir=small_package)
    result = tool.main(['--repeats', '1', '--iters', '2', '--warmup', '1', '--batch-size', '2',
                        '--data-root', str(data_root), '--out', str(tmp_path / 'r.json')])
    assert json.loads((tmp_path / 'r.json').read_text())['rows'] == result['rows']
    dino, mst = result['rows']['this/dino'], result['rows']['this/mst_guided_mask']
    for row in (dino, mst):
        assert row['images_per_s']['median'] > 0 and 0 < row['mfu']['median'] < 1
        assert all(row['ms'][part]['min'] >= 0 for part in recipe_speed.PARTS)
        # The views are made by the data preprocessor, not by the loader.
        assert row['ms']['preprocess']['median'] > 0
    # MST's decoder and the global crops' last-layer patches: more FLOP per image than DINO.
    assert mst['flop_per_image'] > 1.2 * dino['flop_per_image']


def test_the_docs_rows_are_the_tools_rendering_of_the_committed_runs():
    doc = (REPO / 'docs' / 'benchmarks.md').read_text()
    # recipe_speed/: batched views against per-image ones (the README's speed line);
    # view_arithmetic/: PIL-exact batched views against the rounding version before
    runs = sorted([*(REPO / 'docs' / 'results' / 'recipe_speed').glob('*.json'),
                   *(REPO / 'docs' / 'results' / 'view_arithmetic').glob('*.json')])
    linked = set(re.findall(r'\(results/(?:recipe_speed|view_arithmetic)/([\w.-]+)\.json\)',
                            doc))
    assert runs and linked == {run.stem for run in runs}
    for path in runs:
        result = json.loads(path.read_text())
        assert not any(c.endswith('+dirty') for c in result['commits'].values()), path.name
        run = re.search(r'_([a-z])\.json$', path.name).group(1)
        for row in recipe_speed.doc_rows(result, run):
            assert row in doc, (path.name, row)
        # The published speed-up is the median of the per-repetition ratios in the JSON.
        by = {(r['code'], r['variant'], r['repeat']): r['images_per_s'] for r in result['runs']}
        repeats = {r['repeat'] for r in result['runs']}
        dino = [by['this', 'dino', i] / by['baseline', 'dino', i] for i in repeats]
        assert result['ratios']['dino: this / baseline images/s']['median'] == pytest.approx(
            statistics.median(dino))
