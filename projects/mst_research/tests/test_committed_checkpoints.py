"""The 50-epoch evidence run as committed (docs/results/evidence_50e, written part by part by
`evidence.py --parts`): a teacher backbone for every pretrained and supervised row and seed of
the summary, under 6 MB in all, in the layout `mst2downstream.py --target mmpretrain` writes;
each part's row is the summary's, seed by seed; and a k-NN row recomputed from one backbone
matches the committed summary to its printed digit."""
import json
import re

import pytest
import torch
from kit_helpers import REPO, mean_std
from mmengine.config import Config

from mst_mm.engine.safe_loading import read_checkpoint
from mst_mm.evaluation import knn_top1
from mst_mm.models.algorithms.feature_embedder import embed_images
from mst_research.data import image_batches, load_class_folders, write_object_images
from mst_research.patch_probe import load_frozen_backbone

RUN = REPO / 'docs/results/evidence_50e'
CONFIG = REPO / 'projects/mst_research/configs/mst_vit-tiny-p4_1xb64-coslr-50e_animals.py'
ROWS = ('dino', 'mst_decoder', 'mst_random_mask', 'mst_guided_mask', 'supervised')


def committed_files():
    files = sorted((RUN / 'checkpoints').glob('*.pth'))
    assert files, 'no committed backbone under docs/results/evidence_50e/checkpoints'
    return files


def test_the_committed_backbones_are_small_complete_and_in_the_export_layout():
    files = committed_files()
    assert sum(f.stat().st_size for f in files) < 6 * 2 ** 20
    summary = json.loads((RUN / 'summary.json').read_text())
    backbone_cfg = Config.fromfile(str(CONFIG)).model.backbone
    seeds = {}
    for path in files:
        match = re.fullmatch(r'(\w+)_seed(\d+)\.pth', path.name)
        assert match and match[1] in ROWS, path.name
        seeds.setdefault(match[1], []).append(int(match[2]))
        saved = read_checkpoint(str(path), map_location='cpu')   # weights-only
        assert set(saved) == {'state_dict', 'meta'} and saved['meta']['target'] == 'mmpretrain'
        assert all(v.dtype == torch.float32 for v in saved['state_dict'].values())
        load_frozen_backbone(backbone_cfg, str(path))   # every weight, no other key
    for row, found in seeds.items():   # seeds 0, 1, ... (a part may be ahead of the summary)
        assert sorted(found) == list(range(len(found))), (row, found)
    for row in ROWS:   # every seed summarised
        assert len(seeds.get(row, [])) >= len(summary['knn_top1'][row]), row


def test_each_committed_part_is_the_summarys_row_of_its_seed():
    summary = json.loads((RUN / 'summary.json').read_text())
    parts = sorted((RUN / 'results').glob('*.json'))
    assert [p.stem for p in parts] == sorted(p.stem for p in (RUN / 'checkpoints').glob('*.pth'))
    for path in parts:
        part = json.loads(path.read_text())
        row, seed = path.stem.rsplit('_seed', 1)
        assert part['seed'] == int(seed) and part['backbone'] == f'checkpoints/{path.stem}.pth'
        assert re.fullmatch(r'[0-9a-f]{7,}', part['commit']), part['commit']   # no +dirty
        if part['seed'] >= len(summary['knn_top1'].get(row, [])):
            continue   # a part committed after the summary was written
        for key in ('knn_top1', 'linear_top1', 'patch_probe_miou', 'patch_probe_pixel_miou'):
            assert summary[key][row][part['seed']] == part[key], (path.name, key)
        if row != 'supervised':
            assert summary['last_loss_dino'][row][part['seed']] == part['loss_dino']
            assert summary['knn_probe'][row][part['seed']] == part['knn_probe']
            assert [c['epoch'] for c in part['curves']] == list(range(1, 51))


@pytest.mark.slow
def test_a_committed_backbone_recomputes_its_knn_row(tmp_path):
    """DINO seed 0's k-NN top-1 from its committed backbone, on the object images rendered
    anew: the summary's value to its printed digit (the run's own 47.8)."""
    objects = tmp_path / 'objects'
    write_object_images(str(objects))
    cfg = Config.fromfile(str(CONFIG))
    backbone = load_frozen_backbone(cfg.model.backbone, str(RUN / 'checkpoints/dino_seed0.pth'))
    pre = cfg.model.data_preprocessor
    feats = {}
    for split in ('train', 'test'):
        images, labels, _ = load_class_folders(str(objects / split))
        feats[split] = embed_images(backbone, image_batches(images), pre.mean, pre.std)[0], labels
    knn = knn_top1(*feats['train'], *feats['test'], ks=(20, ))[20]
    summary = json.loads((RUN / 'summary.json').read_text())
    assert f"{knn:.1f}" == f"{summary['knn_top1']['dino'][0]:.1f}"


def patch_probe_rows(summary: dict) -> list:
    """docs/evidence.md's patch-probe table, rendered from the summary: every row's patch-grid
    and pixel mIoU with the seeds it holds (of the seeds its k-NN row has)."""
    lines = []
    for row in ('raw_pixels', 'random_init', 'supervised', *ROWS[:4]):
        grid, pixel = summary['patch_probe_miou'][row], summary['patch_probe_pixel_miou'][row]
        if row == 'raw_pixels':
            lines.append(f'| raw pixels | - | {grid:.1f} | {pixel:.1f} |')
            continue
        seeds = str(len(grid))
        if len(grid) < len(summary['knn_top1'][row]):
            seeds += f" of {len(summary['knn_top1'][row])}"
        lines.append(f"| {row.replace('_', ' ') if row == 'random_init' else row} | {seeds} | "
                     f'{mean_std(grid)} | {mean_std(pixel)} |')
    return lines


def test_the_docs_show_the_committed_patch_probe_rows():
    summary = json.loads((RUN / 'summary.json').read_text())
    docs = (REPO / 'docs/evidence.md').read_text()
    for line in patch_probe_rows(summary):
        assert line in docs, line
