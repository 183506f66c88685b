"""Every figure on the README's front page is read off a committed file: the 50-epoch evidence
summary (Results) and the benchmark runs (Speed). The lines are rendered here from the files
and must appear in README.md verbatim."""
import json
import statistics
from typing import List

from kit_helpers import REPO, mean_std

from mst_research import report

RESULTS = REPO / 'docs/results'


def span(values: List[float], digits: int = 2) -> str:
    low, high = f'{min(values):.{digits}f}', f'{max(values):.{digits}f}'
    return low if low == high else f'{low}-{high}'


def evidence_lines() -> List[str]:
    """The Results table: k-NN top-1 and the patch probe's mIoU of every row, with its seeds."""
    summary = json.loads((RESULTS / 'evidence_50e/summary.json').read_text())
    names = [('raw pixels', 'raw_pixels'), ('random init', 'random_init'), ('DINO', 'dino'),
             ('MST', 'mst_guided_mask'), ('MST, decoder only', 'mst_decoder'),
             ('MST, random mask', 'mst_random_mask'), ('supervised', 'supervised')]
    lines = ['| probe | ' + ' | '.join(name for name, _ in names) + ' |',
             '|' + ' --- |' * (len(names) + 1)]
    for label, key in (('k-NN top-1', 'knn_top1'), ('patch mIoU', 'patch_probe_miou')):
        cells = [f'{summary[key][row]:.1f}' if row == 'raw_pixels'
                 else f'{mean_std(summary[key][row])} ({len(summary[key][row])})'
                 for _, row in names]
        lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
    return lines


def transfer_line() -> str:
    # The fine-tunes of the run before the views changed stand (docs/evidence.md says why).
    transfer = json.loads((RESULTS / 'evidence_50e_earlier_views/summary.json').read_text()
                          )['transfer']
    box = {start: mean_std(transfer['mmdet'][start]['bbox_mAP'], 3)
           for start in ('random_init', 'dino', 'mst_guided_mask')}
    miou = {start: mean_std(transfer['mmseg'][start]['mIoU'], 2)
            for start in ('random_init', 'dino', 'mst_guided_mask')}
    return (f"Mask R-CNN's box mAP on 100 held-out scenes of 1-4 animals goes from "
            f"{box['random_init']} (random init) to {box['dino']} (DINO) and "
            f"{box['mst_guided_mask']} (MST), fine-tuned, 2 seeds; SETR's mIoU ties "
            f"({miou['random_init']}, {miou['dino']}, {miou['mst_guided_mask']}).")


def speed_lines() -> List[str]:
    reference = [json.loads(p.read_text())['models']['deit-s']
                 for p in sorted((RESULTS / 'benchmarks').glob('deit-s_*thread*_[ab].json'))
                 if 'cost' not in p.name]
    cost = [json.loads(p.read_text())['models']['deit-s']
            for p in sorted((RESULTS / 'benchmarks').glob('deit-s_*cost*.json'))]
    recipe = [json.loads(p.read_text())['ratios']
              for p in sorted((RESULTS / 'recipe_speed').glob('*.json'))]
    loader = [json.loads(p.read_text())['per_image']['ratios']['dino_over_ours']['median']
              for p in sorted((RESULTS / 'loader_speed').glob('*.json'))]
    memory = json.loads((RESULTS / 'memory/deit-s_cpu.json').read_text())['fit']
    return [
        f'- **Data workers** (the ImageNet configs, 224 px): {span(loader, 1)}x less CPU time '
        "per image than DINO's own pipeline, because the views' flips, colour jitter, grey, "
        'blur and solarisation run batched on the GPU.',
        f'- **Training step** against the original DINO code (ViT-S/16, batch 4, float32, '
        f'2-core CPUs): our DINO mode '
        f"{span([r['dino_mode_speed_vs_reference'] for r in reference])}x the reference's "
        f"speed, MST {span([r['mst_speed_vs_reference'] for r in reference])}x; the guided "
        f"mask costs {span([r['mask_only_ratio'] for r in cost])}x (none measurable), the "
        'decoder the rest.',
        '- **The 32-px evidence recipe**, end to end on one core: '
        f"{span([r['dino: this / baseline images/s']['median'] for r in recipe])}x (DINO) and "
        f"{span([r['mst_guided_mask: this / baseline images/s']['median'] for r in recipe])}x "
        '(MST) the images/s of the per-image views it replaced.',
        '- **GPU**: no run exists yet; `bash projects/mst_research/tools/check_gpu.sh` measures '
        "our step against DINO's at batch 128 in mixed precision, its peak memory and the "
        "loader. Measured on "
        f"the CPU in float32, a DeiT-S step holds {memory['mib_per_image']:.0f} MiB per image.",
    ]


def flat(text: str) -> str:
    """Whitespace collapsed: a sentence is found however the README wraps it."""
    return ' '.join(text.split())


def test_the_results_section_reads_the_committed_evidence_summary():
    readme = flat((REPO / 'README.md').read_text())
    for line in [*evidence_lines(), transfer_line()]:
        assert flat(line) in readme, line
    assert 'docs/results/evidence_50e/evidence.png' in readme
    summary = json.loads((RESULTS / 'evidence_50e/summary.json').read_text())
    knn = summary['knn_top1']
    gains = [statistics.mean(knn[v]) - knn['raw_pixels']
             for v in ('dino', 'mst_decoder', 'mst_random_mask', 'mst_guided_mask')]
    assert f'beats raw pixels by {min(gains):.1f}-{max(gains):.1f} points' in readme


def test_the_speed_section_reads_the_committed_runs():
    readme = flat((REPO / 'README.md').read_text())
    for line in speed_lines():
        assert flat(line) in readme, line


def test_the_renderers_follow_the_files(tmp_path):
    """A changed value changes the rendered line: the check is not vacuous."""
    assert mean_std([1.0, 3.0]) == '2.0 ± 1.4' and mean_std([0.1534], 3) == '0.153'
    assert span([1.116, 1.204]) == '1.12-1.20' and span([3.04, 2.96], 1) == '3.0'


def test_the_quick_start_shows_the_committed_demo_table():
    """docs/results/quick_start/summary.json is Quick-start command 1's summary on this
    project's CPU machine; the README shows its table as the tool prints it."""
    summary = json.loads((RESULTS / 'quick_start/summary.json').read_text())
    seeds = {v: len(summary['knn_top1'][v]) for v in ('dino', 'mst_guided_mask')}
    table = report.format_table(summary, seeds)
    rows = [line for line in table.splitlines() if line.startswith('| ')]
    readme = (REPO / 'README.md').read_text()
    quick_start = readme[readme.index('## Quick start'):readme.index('## Status')]
    assert len(rows) == 2 + 5 and all(row in quick_start for row in rows)
