"""The kit's tools/evidence.py end to end on a few real silhouettes: the rows, the summary's
keys, the k-NN probe curve and the resume-by-skipping of finished units."""
import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kit_helpers import REPO, hand_knn_top1, load_tool, read_split
from mmengine.config import Config
from mmpretrain.registry import MODELS

from mst_mm.converters import backbone_state, load_model
from mst_mm.engine.safe_loading import read_checkpoint
from mst_research import data as animal_shapes
from mst_research import probes, recipes, report, runs
from mst_research.data import (
    class_folder_files,
    load_class_folders,
    load_object_masks,
    load_silhouettes,
    stratified_split,
    validation_split,
    write_object_images,
)
from mst_research.patch_probe import masked_splits, probe_patches

VARIANTS = ('dino', 'mst_decoder', 'mst_random_mask', 'mst_guided_mask')
# The commit that made the views PIL-exact, and the 50-epoch run made before it.
VIEW_CHANGE = '7415b49'
EARLIER_VIEWS = 'docs/results/evidence_50e_earlier_views'
GUIDANCE_KEYS = {'attention_on_object_share', 'candidates_on_object_share',
                 'masked_on_object_share'}


def hand_probe(evidence, checkpoint: str, data_root):
    """k-NN top-1 (k = 20) of the EMA teacher's CLS features, the share of its CLS attention
    on object patches (>= half object pixels) and the object patches' share, by hand."""
    model = MODELS.build(Config.fromfile(recipes.VIT_CONFIG).model)
    model.load_state_dict(read_checkpoint(checkpoint, map_location='cpu')['state_dict'])
    teacher = model.teacher.module[0]
    teacher.eval()  # mmpretrain's train() returns None: no chaining
    objects = data_root / 'objects'
    knn = hand_knn_top1(lambda x: teacher.forward_mst(x).global_feat, model.data_preprocessor,
                        objects, ks=(20, ), splits=('train', 'test'))[20]
    images, _ = read_split(objects, 'test', model.data_preprocessor)
    with torch.no_grad():
        attn = teacher.forward_mst(images, with_attn=True).attn
    masks = load_object_masks(str(objects), 'test')
    pixels = torch.stack([torch.from_numpy(masks[f'test/{p.parent.name}/{p.name}'])
                          for p in sorted((objects / 'test').glob('*/*.png'))]).float()
    patch = pixels.shape[-1] // teacher.patch_resolution[0]
    on_object = F.avg_pool2d(pixels[:, None], patch).flatten(1) >= 0.5
    share = ((attn * on_object).sum(1) / attn.sum(1)).mean()
    return knn, float(share), float(on_object.float().mean())


@pytest.fixture(scope='module')
def evidence():
    return load_tool('projects/mst_research/tools/evidence.py')


@pytest.mark.slow
def test_quick_run_writes_every_row_with_the_summary_keys(tmp_path, small_package,
                                                          evidence, capsys):
    data_root = tmp_path / 'animals'
    write_object_images(str(data_root / 'objects'), test_per_class=1, package_dir=small_package)
    out, parts = tmp_path / 'evidence', tmp_path / 'parts'
    argv = ['--quick', '--skip-transfer', '--data-root', str(data_root), '--out', str(out),
            '--batch-size', '2', '--seeds', '2', '--variants', 'dino,mst_guided_mask',
            '--jobs', '2']
    summary = evidence.main([*argv, '--parts', str(parts)])   # two processes side by side

    assert summary == json.loads((out / 'summary.json').read_text())
    assert set(summary) == {'ln_k', 'image_views_per_run', 'knn_top1', 'linear_top1',
                            'patch_probe_miou', 'patch_probe_pixel_miou', 'patch_probe_settings',
                            'last_loss_dino', 'knn_probe', 'guidance', 'transfer', 'commit',
                            'seeds'}
    assert summary['seeds'] == {row: [0, 1] for row in ('random_init', 'supervised', 'dino',
                                                         'mst_guided_mask')}
    assert summary['commit'].startswith(
        subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True,
                       text=True).stdout.strip())
    assert summary['image_views_per_run'] == 1 * 10 * 3   # one epoch of 3 images a class
    assert summary['transfer'] is None
    assert summary['ln_k'] == pytest.approx(math.log(1024))
    for key in ('knn_top1', 'linear_top1', 'patch_probe_miou', 'patch_probe_pixel_miou'):
        assert set(summary[key]) == {'raw_pixels', 'random_init', 'supervised', 'dino',
                                     'mst_guided_mask'}
        assert isinstance(summary[key]['raw_pixels'], float)
        assert all(len(summary[key][row]) == 2   # --seeds 2 sets the supervised row's too
                   for row in ('random_init', 'supervised', 'dino', 'mst_guided_mask'))
    # The two seeds are two different trainings.
    assert summary['last_loss_dino']['dino'][0] != summary['last_loss_dino']['dino'][1]
    guidance = summary['guidance']
    for variant in ('dino', 'mst_guided_mask'):
        assert set(guidance[variant]) == GUIDANCE_KEYS

    # The row's k-NN and attention share, recomputed by hand from its checkpoint.
    row = json.loads((out / 'results' / 'mst_guided_mask_seed0.json').read_text())
    knn, attention_share, area_share = hand_probe(evidence, row['checkpoint'], data_root)
    assert row['knn_top1'] == pytest.approx(knn)
    assert row['attention_on_object_share'] == pytest.approx(attention_share, rel=1e-4)
    assert guidance['object_area_share'] == pytest.approx(area_share)
    # The k-NN probe ran before training and after the epoch; its last value is the table's.
    assert [epoch for epoch, _ in row['knn_probe']] == [0, 1]
    assert row['knn_probe'][-1][1] == pytest.approx(row['knn_top1'])
    assert summary['knn_probe']['mst_guided_mask'][0] == row['knn_probe']
    assert [c['epoch'] for c in row['guidance_by_epoch']] == [1]
    # The patch probe is the package's, on the teacher's patch tokens, with its default settings.
    model = load_model(recipes.pretrain_config(
        recipes.VIT_CONFIG, 'mst_guided_mask', 0, dict(epochs=1), str(data_root), str(out)),
        row['checkpoint'], 0)
    splits = masked_splits(str(data_root / 'objects'))
    by_hand = probe_patches(*splits, *probes.teacher_of(model))
    assert row['patch_probe_miou'] == by_hand['patch_miou']
    assert row['patch_probe_pixel_miou'] == by_hand['pixel_miou']
    assert summary['patch_probe_settings'] == by_hand['settings']
    raw = probe_patches(*splits, patch_size=4)
    assert summary['patch_probe_miou']['raw_pixels'] == raw['patch_miou']
    assert (out / 'pictures' / 'pretraining_curves.png').stat().st_size > 10_000
    assert (out / 'pictures' / 'evidence.png').stat().st_size > 10_000
    table = (out / 'evidence_table.md').read_text()
    assert '| raw pixels |' in table and '| mst_guided_mask | 2 |' in table
    assert '| supervised | 2 |' in table

    # The parts to commit: every pretraining and supervised unit's row with its seed, the
    # commit whose code ran it and its teacher backbone; the summary and the README's pictures.
    trained = ['dino_seed0', 'dino_seed1', 'mst_guided_mask_seed0', 'mst_guided_mask_seed1',
               'supervised_seed0', 'supervised_seed1']
    assert sorted(p.name for p in (parts / 'results').iterdir()) == [f'{n}.json' for n in trained]
    for name in trained:
        unit = json.loads((out / 'results' / f'{name}.json').read_text())
        part = json.loads((parts / 'results' / f'{name}.json').read_text())
        assert part == dict({k: v for k, v in unit.items() if k != 'checkpoint'},
                            seed=int(name[-1]), commit=summary['commit'],
                            backbone=f'checkpoints/{name}.pth')
        saved = read_checkpoint(str(parts / part['backbone']), map_location='cpu')
        weights = 'student' if name.startswith('supervised') else 'teacher'
        assert saved['meta'] == dict(source=f'{name}/epoch_1.pth', weights=weights,
                                     target='mmpretrain')
        expected = backbone_state(unit['checkpoint'], weights)
        assert saved['state_dict'].keys() == expected.keys() and all(
            torch.equal(saved['state_dict'][k], expected[k]) for k in expected)
        if not name.startswith('supervised'):   # the epoch means of its logged losses
            assert [c['epoch'] for c in unit['curves']] == [1]
            assert set(unit['curves'][0]) == {'epoch', *report.CURVE_KEYS}
    assert json.loads((parts / 'summary.json').read_text()) == summary
    assert (parts / 'evidence.png').stat().st_size > 10_000
    # A new machine with the parts alone: nothing trains again, the summary is the same.
    fresh = tmp_path / 'fresh'
    assert evidence.main([*argv[:5], str(fresh), *argv[6:], '--parts', str(parts)]) == summary
    assert not (fresh / 'pretrain').exists() and not (fresh / 'supervised').exists()

    # A second run skips every finished unit: same summary, no new training; a unit stored
    # without the patch probe (by older code) gets it from its checkpoint.
    mtime = (out / 'results' / 'dino_seed1.json').stat().st_mtime
    old = out / 'results' / 'mst_guided_mask_seed1.json'
    stored = json.loads(old.read_text())
    old.write_text(json.dumps({k: v for k, v in stored.items() if 'patch_probe' not in k}))
    # and one stored without its curves gets them from its run's logs.
    guided = out / 'results' / 'mst_guided_mask_seed0.json'
    with_curves = json.loads(guided.read_text())
    guided.write_text(json.dumps({k: v for k, v in with_curves.items() if k != 'curves'}))
    (out / 'pictures' / 'pretraining_curves.png').unlink()
    assert evidence.main(argv) == summary
    assert json.loads(guided.read_text()) == with_curves
    assert (out / 'pictures' / 'pretraining_curves.png').stat().st_size > 10_000
    assert (out / 'results' / 'dino_seed1.json').stat().st_mtime == mtime
    assert json.loads(old.read_text()) == stored

    # The run's probes again from its teacher backbones, as mst2downstream.py exports them.
    convert = load_tool('tools/model_converters/mst2downstream.py').main
    for name in ('dino_seed0', 'dino_seed1', 'mst_guided_mask_seed0', 'supervised_seed0'):
        weights = 'student' if name.startswith('supervised') else 'teacher'
        unit = json.loads((out / 'results' / f'{name}.json').read_text())
        convert([unit['checkpoint'], str(out / 'checkpoints' / f'{name}.pth'),
                 '--target', 'mmpretrain', '--weights', weights])
    capsys.readouterr()
    again = evidence.main(['--data-root', str(data_root), '--out', str(tmp_path / 'again'),
                           '--from-checkpoints', str(out)])
    assert 'every recomputed value equals the committed one' in capsys.readouterr().out
    for key in ('knn_top1', 'linear_top1', 'patch_probe_miou', 'patch_probe_pixel_miou'):
        for row in ('raw_pixels', 'random_init', 'dino', 'supervised'):
            assert again[key][row] == summary[key][row], (key, row)
        # Seed 1 has no file here: its committed value is kept, seed 0's is recomputed.
        assert again[key]['mst_guided_mask'] == summary[key]['mst_guided_mask']
    assert again['guidance']['dino'] == summary['guidance']['dino']
    assert again['knn_probe'] == summary['knn_probe']   # from training: kept as committed
    assert (tmp_path / 'again' / 'pictures' / 'evidence.png').stat().st_size > 10_000
    # A changed committed value is named, at its printed digit.
    changed = dict(summary, knn_top1=dict(summary['knn_top1'], dino=[12.34, 0.0]))
    (out / 'summary.json').write_text(json.dumps(changed))
    _, differences = report.recomputed_summary(changed, dict(dino=[dict(
        json.loads((tmp_path / 'again' / 'results' / 'dino_seed0.json').read_text()))]))
    assert differences == [f"knn_top1 dino seed 0: committed 12.3, recomputed "
                           f"{summary['knn_top1']['dino'][0]:.1f}"]

    # A unit's numbers do not depend on the lane it ran in: dino seed 1 again, in this process.
    alone = tmp_path / 'alone'
    evidence.main([*argv[:5], str(alone), *argv[6:-2], '--units', 'dino_seed1'])
    again = json.loads((alone / 'results' / 'dino_seed1.json').read_text())
    lane = json.loads((out / 'results' / 'dino_seed1.json').read_text())
    for key in ('knn_top1', 'linear_top1', 'loss_dino', 'attention_on_object_share'):
        assert again[key] == lane[key]
    capsys.readouterr()


def test_the_validation_split_holds_out_100_images_a_class_of_the_train_split():
    _, labels = load_silhouettes()
    train, _ = stratified_split(labels)
    fit, val = validation_split(labels[train])
    assert len(fit) == 7000 and len(val) == 1000 and not set(fit) & set(val)
    assert np.bincount(labels[train][val]).tolist() == [100] * 10
    assert all((a == b).all() for a, b in zip((fit, val), validation_split(labels[train])))


def test_validation_mode_probes_without_the_test_images(tmp_path, small_package,
                                                       evidence, monkeypatch):
    data_root = tmp_path / 'animals'
    objects = data_root / 'objects'
    write_object_images(str(objects), test_per_class=1, package_dir=small_package)
    monkeypatch.setattr(animal_shapes, 'VAL_PER_CLASS', 1)   # 3 train images a class here
    schedule = dict(epochs=1, validation=True, probe_interval=3,
                    cfg_options={'model.base_momentum': 0.004, 'custom_hooks.0.start': 0.04})
    cfg = recipes.pretrain_config(recipes.VIT_CONFIG, 'dino', 0, schedule, str(data_root),
                                   str(tmp_path / 'work'))
    fit, val = recipes.split_indices(str(data_root), schedule)
    paths, labels = class_folder_files(str(objects / 'train'))
    assert len(fit) == 20 and len(val) == 10 and not set(fit) & set(val)
    assert labels[val].tolist() == list(range(10))
    assert cfg.train_dataloader.dataset.indices == fit
    (hook, ) = [h for h in cfg.custom_hooks if h.type == 'KNNProbeHook']
    assert hook.interval == 3
    for loader, indices in ((hook.reference_dataloader, fit), (hook.query_dataloader, val)):
        assert loader.dataset.data_root == str(objects / 'train')
        assert loader.dataset.indices == indices
    # The recipe options reach the config, the teacher's temperature hook included.
    assert cfg.model.base_momentum == 0.004 and cfg.custom_hooks[0].start == 0.04

    # The probe's queries are the validation images with their masks; no test image is read.
    shutil.rmtree(objects / 'test')
    probe = probes.Probe(str(data_root), validation=True)
    images, _, _ = load_class_folders(str(objects / 'train'))
    assert np.array_equal(probe.test_images, images[val])
    assert np.array_equal(probe.train_images, images[fit])
    assert probe.test_labels.tolist() == labels[val].tolist()
    masks = animal_shapes.load_object_masks(str(objects), 'train')
    assert np.array_equal(probe.test_masks.numpy(),
                          np.stack([masks[f'train/{paths[i]}'] for i in val]))


def test_the_long_recipe_config_is_the_candidate_chosen_on_the_validation_split(evidence):
    """projects/mst_research/configs/...-50e_animals.py is the 6-epoch config with the search's
    options (as docs/evidence.md lists them), scaled to 50 epochs, as the search ran it."""
    chosen = {'model.base_momentum': 0.004, 'custom_hooks.0.start': 0.02,
              'custom_hooks.0.end': 0.02}
    long_config = os.path.join(recipes.KIT_CONFIGS, 'mst_vit-tiny-p4_1xb64-coslr-50e_animals.py')
    data_root = 'no/data/needed'
    searched = recipes.pretrain_config(
        recipes.VIT_CONFIG, 'dino', 10,
        dict(epochs=50, cfg_options=chosen, probe_interval=2), data_root, 'work')
    config = recipes.pretrain_config(long_config, 'dino', 10, dict(epochs=50), data_root,
                                      'work')
    for key in ('model', 'param_scheduler', 'custom_hooks', 'train_cfg', 'default_hooks',
                'optim_wrapper', 'train_dataloader'):
        assert config[key] == searched[key], key
    assert config.param_scheduler[0].end == 8 and config.custom_hooks[2].interval == 2


def test_the_units_are_planned_in_stages_and_balanced_over_lanes(evidence):
    schedule = dict(seeds=dict(dino=3, mst_decoder=2, mst_random_mask=2, mst_guided_mask=3),
                    supervised_seeds=2, finetune_seeds=2, transfer_targets=('mmdet', 'mmseg'))
    first, second = runs.plan_units(schedule)
    assert len(first) == 3 + 2 + 10 + 2 and len(second) == 24   # fine-tuned and frozen
    assert 'random_init_seed2' in first and 'swin_dino_seed0' in first
    assert 'supervised_seed1' in first and 'mmdet_random_init_ft1' in second
    assert 'mmseg_mst_guided_mask_ft0' in second and 'mmdet_frozen_dino_ft1' in second
    assert runs.plan_units({**schedule, 'transfer_targets': ()}) == [first[:15]]
    # SETR alone fine-tunes the ViT checkpoints: no MaskSwin pretraining is planned for it.
    seg_first, seg_second = runs.plan_units({**schedule, 'transfer_targets': ('mmseg',)})
    assert seg_first == first[:15]
    assert seg_second == [name for name in second if name.startswith('mmseg')]
    assert len(seg_second) == 12
    lanes = runs.split_lanes(first, 2)
    assert sorted(sum(lanes, [])) == sorted(first)
    minutes = [sum(runs.UNIT_MINUTES.get(n.split('_')[0], 10) for n in lane)
               for lane in lanes]
    assert abs(minutes[0] - minutes[1]) <= 10
    assert runs.split_lanes(['dino_seed0'], 2) == [['dino_seed0']]


def test_the_supervised_seeds_follow_their_flag_then_seeds_then_the_schedule(evidence):
    def supervised_seeds(*flags):
        return recipes.make_schedule(evidence.parse_args(list(flags)))['supervised_seeds']

    assert supervised_seeds() == recipes.SCHEDULES['full']['supervised_seeds'] == 2
    assert supervised_seeds('--quick') == 1
    assert supervised_seeds('--seeds', '3') == 3
    assert supervised_seeds('--seeds', '3', '--supervised-seeds', '0') == 0
    schedule = recipes.make_schedule(evidence.parse_args(['--supervised-seeds', '0']))
    assert schedule['seeds']['dino'] == 3   # the variants keep the schedule's seeds
    assert not any(name.startswith('supervised') for name in
                   runs.plan_units(schedule)[0])


def test_a_frozen_transfer_unit_runs_the_frozen_fine_tune(evidence, monkeypatch):
    calls = []
    monkeypatch.setattr(runs, 'finetune_row', lambda *args: calls.append(args))
    for name in ('mmdet_frozen_mst_guided_mask_ft1', 'mmseg_random_init_ft0'):
        runs.run_unit(name, None, None, {}, 'data', 'out')
    assert [(c[1], c[2], c[3], c[-1]) for c in calls] == [
        ('mmdet', 'mst_guided_mask', 1, True), ('mmseg', 'random_init', 0, False)]


def test_bad_arguments_are_named(tmp_path, evidence):
    with pytest.raises(SystemExit):
        evidence.parse_args(['--variants', 'dino,mae'])
    with pytest.raises(SystemExit):   # transfer starts from dino and mst_guided_mask
        evidence.parse_args(['--variants', 'dino'])
    with pytest.raises(SystemExit):
        evidence.parse_args(['--transfer-targets', 'mmseg,coco'])
    assert evidence.parse_args(['--transfer-targets', 'mmseg,mmdet']).transfer_targets == (
        'mmdet', 'mmseg')
    assert evidence.parse_args(['--variants', 'dino', '--skip-transfer']).transfer_targets == ()
    with pytest.raises(SystemExit, match='write_animal_shapes'):
        recipes.prepare_data(str(tmp_path), transfer=False)


def assert_table_rows_in(table: str, text: str, count: int) -> None:
    """The tool's table has ``count`` rows (the header, then one per start or variant), and
    ``text`` holds each of them verbatim."""
    rows = [line for line in table.splitlines() if line.startswith('| ') and '---' not in line]
    assert len(rows) == count
    for line in rows:
        assert line in text, line


def test_the_docs_state_the_committed_full_run_digit_for_digit(evidence):
    """docs/results/evidence_summary.json is the 6-epoch full run's summary: docs/evidence.md
    shows its tables as the tool renders them, line for line."""
    summary = json.loads((REPO / 'docs/results/evidence_summary.json').read_text())
    assert set(summary['knn_top1']) == {'raw_pixels', 'random_init', *recipes.VARIANTS}
    seeds = {v: len(summary['knn_top1'][v]) for v in recipes.VARIANTS}
    assert seeds['dino'] >= 3 and seeds['mst_guided_mask'] >= 3
    assert min(seeds.values()) >= 2
    pretrained, transfer = report.format_table(summary, seeds).split('Transfer to the scenes')
    docs = (REPO / 'docs/evidence.md').read_text()
    assert_table_rows_in(pretrained, docs, 1 + 2 + 4)
    assert_table_rows_in(transfer, docs, 1 + 3)


def test_the_docs_state_the_committed_50_epoch_run_digit_for_digit(evidence):
    """docs/results/evidence_50e/summary.json is the run at the long recipe on the current
    views: DINO and MST-guided with at least 3 seeds of every probe, both ablations with 2,
    the supervised ceiling, made by code at or after the view change; docs/evidence.md shows
    its table as the tool prints it, and the transfer table of the run before it (whose
    fine-tunes stand)."""
    summary = json.loads((REPO / 'docs/results/evidence_50e/summary.json').read_text())
    assert summary['image_views_per_run'] >= 400_000
    assert set(summary['knn_top1']) == {'raw_pixels', 'random_init', 'supervised',
                                        *recipes.VARIANTS}
    seeds = {v: len(summary['knn_top1'][v]) for v in recipes.VARIANTS}
    assert min(seeds['dino'], seeds['mst_guided_mask']) >= 3
    assert min(seeds['mst_decoder'], seeds['mst_random_mask']) >= 2   # the ablations
    for row in ('supervised', *recipes.VARIANTS):
        assert summary['seeds'][row] == list(range(len(summary['knn_top1'][row])))
        for key in ('linear_top1', 'patch_probe_miou', 'patch_probe_pixel_miou'):
            assert len(summary[key][row]) == len(summary['knn_top1'][row]), (key, row)
    assert all(len(curve) == 26 for runs in summary['knn_probe'].values() for curve in runs)
    docs = (REPO / 'docs/evidence.md').read_text()
    assert_table_rows_in(report.format_table(summary, seeds), docs, 1 + 3 + len(seeds))
    assert_table_rows_in(report.format_seed_table(summary), docs, 1 + sum(seeds.values()))
    assert 'docs/results/evidence_50e/evidence.png' in (REPO / 'README.md').read_text()

    earlier = json.loads((REPO / f'{EARLIER_VIEWS}/summary.json').read_text())
    assert set(earlier['transfer']) == {'mmdet', 'mmdet_frozen', 'mmseg', 'mmseg_frozen'}
    assert all(len(values) == 2 for part in earlier['transfer'].values()
               for runs in part.values() for values in runs.values())
    earlier_seeds = {v: len(earlier['knn_top1'][v]) for v in recipes.VARIANTS}
    pretrained, transfer = report.format_table(earlier, earlier_seeds).split(
        'Transfer to the scenes')
    assert_table_rows_in(pretrained, docs, 1 + 7)
    assert_table_rows_in(transfer, docs, 1 + 6)
    assert ' - |' not in transfer   # every start, both targets, fine-tuned and frozen

    commit = summary['commit']
    assert commit and '+dirty' not in commit
    ancestry = subprocess.run(['git', 'merge-base', '--is-ancestor', VIEW_CHANGE, commit],
                              cwd=REPO, capture_output=True)
    if ancestry.returncode == 128:
        pytest.skip('this checkout has no history to place the summary\'s commit in')
    assert ancestry.returncode == 0, f'{commit} is not at or after the view change'


def test_the_docs_state_the_three_seeds_of_the_quick_start_digit_for_digit(evidence):
    """docs/results/quick_start_3_seeds/summary.json is Quick-start command 1 with --seeds 3
    on the current views, quick_start_amd_epyc/ the command with its one seed on another CPU:
    docs/evidence.md shows both tables as the tool renders them."""
    docs = (REPO / 'docs/evidence.md').read_text()
    for run, runs_per_variant in (('quick_start_3_seeds', 3), ('quick_start_amd_epyc', 1)):
        summary = json.loads((REPO / f'docs/results/{run}/summary.json').read_text())
        seeds = {v: len(summary['knn_top1'][v]) for v in ('dino', 'mst_guided_mask')}
        assert seeds == {'dino': runs_per_variant, 'mst_guided_mask': runs_per_variant}
        assert_table_rows_in(report.format_table(summary, seeds), docs, 1 + 5)
