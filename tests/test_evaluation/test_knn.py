"""Chunked weighted k-NN equals a brute-force computation."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mst_mm.evaluation import knn_top1, weighted_knn_scores


def brute_force_votes(train, labels, query, num_classes, k, t):
    train = train / train.norm(dim=1, keepdim=True)
    query = query / query.norm(dim=1, keepdim=True)
    votes = torch.zeros(len(query), num_classes, dtype=torch.float64)
    for i, q in enumerate(query.double()):
        sims = [(float(q @ x.double()), int(y)) for x, y in zip(train, labels)]
        sims.sort(key=lambda s: -s[0])
        for sim, y in sims[:k]:
            votes[i, y] += torch.exp(torch.tensor(sim / t, dtype=torch.float64))
    return votes


def read_split(root, split, preprocessor):
    """``root/split/<class>/*.png`` read with PIL (RGB) and normalised by hand with the
    preprocessor's statistics, and their labels (sorted class folders, sorted files)."""
    paths = sorted(Path(root, split).glob('*/*.png'))
    images = np.stack([np.array(Image.open(p).convert('RGB')) for p in paths])
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    x = (x - preprocessor.mean.reshape(1, 3, 1, 1)) / preprocessor.std.reshape(1, 3, 1, 1)
    classes = sorted({p.parent.name for p in paths})
    return x, torch.tensor([classes.index(p.parent.name) for p in paths])


def hand_knn_top1(embed, preprocessor, root, ks, splits=('train', 'val')) -> dict:
    """Brute-force k-NN top-1 (%) of ``embed``'s features of the two splits."""
    with torch.no_grad():
        (train, train_labels), (val, val_labels) = (
            (embed(x), labels) for x, labels in (read_split(root, s, preprocessor)
                                                 for s in splits))
    num_classes = int(train_labels.max()) + 1
    return {k: float((brute_force_votes(train, train_labels, val, num_classes,
                                        min(k, len(train)), 0.07).argmax(1)
                      == val_labels).float().mean() * 100) for k in ks}


@pytest.mark.parametrize('chunk_size', [7, 64, 4096])
def test_chunked_votes_equal_brute_force(chunk_size):
    gen = torch.Generator().manual_seed(0)
    train, query = torch.randn(150, 16, generator=gen), torch.randn(23, 16, generator=gen)
    labels = torch.randint(0, 5, (150,), generator=gen)
    votes = weighted_knn_scores(train, labels, query, 5, ks=(1, 10, 20, 200),
                                temperature=0.07, chunk_size=chunk_size)
    for k, got in votes.items():
        expected = brute_force_votes(train, labels, query, 5, min(k, 150), 0.07)
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


def test_top1_on_separable_clusters_and_errors():
    gen = torch.Generator().manual_seed(1)
    centres = torch.randn(3, 8, generator=gen) * 5
    labels = torch.arange(3).repeat_interleave(20)
    feats = centres[labels] + 0.1 * torch.randn(60, 8, generator=gen)
    acc = knn_top1(feats[::2], labels[::2], feats[1::2], labels[1::2], ks=(1, 5))
    assert acc == {1: 100.0, 5: 100.0}
    with pytest.raises(ValueError, match='labels'):
        knn_top1(feats, labels[:3], feats, labels)


def _tiny_mst_and_embedder(weights='teacher'):
    from mmengine.config import Config
    from mmpretrain.registry import MODELS

    from tests.helpers import REPO
    knn_cfg = Config.fromfile(str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py'))
    demo_cfg = Config.fromfile(str(REPO / 'configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py'))
    torch.manual_seed(0)
    mst = MODELS.build(demo_cfg.model)
    mst.init_weights()
    with torch.no_grad():  # make teacher and student differ
        for p in mst.teacher.parameters():
            p.add_(0.01)
    knn_cfg.model.weights = weights
    return mst, knn_cfg


@pytest.mark.parametrize('weights', ['teacher', 'student'])
def test_embedder_loads_the_chosen_mst_backbone_with_exact_keys(weights):
    from mmpretrain.registry import MODELS

    mst, knn_cfg = _tiny_mst_and_embedder(weights)
    embedder = MODELS.build(knn_cfg.model)
    embedder.load_state_dict(mst.state_dict(), strict=True)  # zero missing / unexpected
    source = mst.teacher.module[0] if weights == 'teacher' else mst.backbone
    for name, value in embedder.backbone.state_dict().items():
        torch.testing.assert_close(value, source.state_dict()[name])


@pytest.mark.slow
def test_knn_test_loop_equals_direct_computation(tmp_path):
    from mmengine.runner import Runner

    from tests.helpers import make_image_folder
    mst, cfg = _tiny_mst_and_embedder()
    ckpt = tmp_path / 'mst.pth'
    torch.save({'state_dict': mst.state_dict()}, ckpt)
    make_image_folder(tmp_path / 'data' / 'train', classes=3, per_class=6, seed=0)
    make_image_folder(tmp_path / 'data' / 'val', classes=3, per_class=3, seed=1)
    for loader in (cfg.test_dataloader, cfg.test_cfg.train_dataloader):
        split = 'val' if loader is cfg.test_dataloader else 'train'
        loader.dataset.data_root = str(tmp_path / 'data' / split)
        loader.batch_size = 4
    cfg.test_evaluator.ks = (1, 5, 200)
    cfg.work_dir, cfg.load_from, cfg.log_level = str(tmp_path / 'work'), str(ckpt), 'WARNING'
    runner = Runner.from_cfg(cfg)
    metrics = runner.test()

    embedder = runner.model
    feats = {}
    for split in ('train', 'val'):
        loader = runner.test_loop.reference_dataloader if split == 'train' else \
            runner.test_loop.dataloader
        outs = [s for batch in loader for s in embedder.test_step(batch)]
        feats[split] = (torch.stack([s.embedding for s in outs]),
                        torch.tensor([int(s.gt_label) for s in outs]))
    expected = knn_top1(*feats['train'], *feats['val'], num_classes=3, ks=(1, 5, 200))
    assert metrics == pytest.approx({f'knn/top1_k{k}': v for k, v in expected.items()})
    assert len(feats['train'][0]) == 18 and len(feats['val'][0]) == 9


def test_knn_eval_tool_prints_and_writes_json(tmp_path, capsys):
    import json

    from tests.helpers import REPO, load_tool, make_image_folder
    mst, knn_cfg = _tiny_mst_and_embedder()
    ckpt = tmp_path / 'mst.pth'
    torch.save({'state_dict': mst.state_dict()}, ckpt)
    make_image_folder(tmp_path / 'd' / 'train', classes=3, per_class=5)
    make_image_folder(tmp_path / 'd' / 'val', classes=3, per_class=4, seed=3)
    tool = load_tool('tools/analysis/knn_eval.py')
    out = tmp_path / 'knn.json'
    result = tool.main([str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py'), str(ckpt),
                        '--ks', '1', '3', '--out', str(out), '--work-dir', str(tmp_path / 'w'),
                        '--cfg-options', f'data_root={tmp_path / "d"}',
                        f'test_dataloader.dataset.data_root={tmp_path / "d" / "val"}',
                        f'test_cfg.train_dataloader.dataset.data_root={tmp_path / "d" / "train"}'])
    from mmpretrain.registry import MODELS
    embedder = MODELS.build(knn_cfg.model)
    embedder.load_state_dict(mst.state_dict())
    embedder.eval()
    expected = hand_knn_top1(lambda x: embedder(x, mode='tensor'), embedder.data_preprocessor,
                             tmp_path / 'd', ks=(1, 3))
    assert result == pytest.approx(expected)
    assert json.loads(out.read_text()) == {f'top1_k{k}': v for k, v in result.items()}
    assert '|   k | top-1 (%) |' in capsys.readouterr().out
    from mst_mm.errors import CheckpointError
    with pytest.raises(CheckpointError, match='does not exist'):
        tool.main([str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py'),
                   str(tmp_path / 'missing.pth')])


@pytest.mark.slow
def test_knn_eval_with_two_processes_gives_the_single_process_numbers(tmp_path):
    """--launcher pytorch: two gloo processes share the embedding, rank 0 votes and writes."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import REPO, load_tool, make_image_folder
    from tests.test_engine.test_distributed import free_port
    mst, _ = _tiny_mst_and_embedder()
    ckpt = tmp_path / 'mst.pth'
    torch.save({'state_dict': mst.state_dict()}, ckpt)
    # Odd sizes: the distributed samplers pad, and the padding must not vote.
    make_image_folder(tmp_path / 'd' / 'train', classes=3, per_class=3)
    make_image_folder(tmp_path / 'd' / 'val', classes=3, per_class=1, seed=3)
    args = [str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py'), str(ckpt),
            '--ks', '1', '3', '--cfg-options',
            f'test_dataloader.dataset.data_root={tmp_path / "d" / "val"}',
            f'test_cfg.train_dataloader.dataset.data_root={tmp_path / "d" / "train"}',
            'test_dataloader.batch_size=2', 'test_cfg.train_dataloader.batch_size=2',
            'model_wrapper_cfg.type=tests.cpu_distributed.DeviceAgnosticDDP']  # DDP on CPU
    single = load_tool('tools/analysis/knn_eval.py').main(
        [*args[:2], '--out', str(tmp_path / 'one.json'), '--work-dir', str(tmp_path / 'w1'),
         *args[2:]])
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
           '--master_port', str(free_port()), str(REPO / 'tools/analysis/knn_eval.py'),
           *args[:2], '--launcher', 'pytorch', '--out', str(tmp_path / 'two.json'),
           '--work-dir', str(tmp_path / 'w2'), *args[2:]]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / 'two.json').read_text()) == json.loads(
        (tmp_path / 'one.json').read_text()) == {f'top1_k{k}': v for k, v in single.items()}
    assert result.stdout.count('|   k | top-1 (%) |') == 1   # rank 0 alone prints


@pytest.mark.slow
def test_knn_eval_under_srun_evaluates_with_two_gloo_ranks(tmp_path):
    """knn_eval.py --launcher slurm through tests/fake_slurm's srun: two CPU ranks (gloo,
    chosen because there is no GPU) give the single process's k-NN numbers."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import REPO, load_tool, make_image_folder
    from tests.test_engine.test_distributed import free_port
    mst, _ = _tiny_mst_and_embedder()
    ckpt = tmp_path / 'mst.pth'
    torch.save({'state_dict': mst.state_dict()}, ckpt)
    make_image_folder(tmp_path / 'd' / 'train', classes=3, per_class=3)
    make_image_folder(tmp_path / 'd' / 'val', classes=3, per_class=1, seed=3)
    config = str(REPO / 'configs/benchmarks/knn/knn_vit-tiny_demo.py')
    options = ['--cfg-options', f'test_dataloader.dataset.data_root={tmp_path / "d" / "val"}',
               f'test_cfg.train_dataloader.dataset.data_root={tmp_path / "d" / "train"}',
               'test_dataloader.batch_size=2', 'test_cfg.train_dataloader.batch_size=2',
               'model_wrapper_cfg.type=tests.cpu_distributed.DeviceAgnosticDDP']  # DDP on CPU
    single = load_tool('tools/analysis/knn_eval.py').main(
        [config, str(ckpt), '--work-dir', str(tmp_path / 'w1'), *options])
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1', GPUS='2',
               GPUS_PER_NODE='2', MASTER_PORT=str(free_port()),
               PYTHONFAULTHANDLER='1',  # a crash in a rank prints its Python stack
               PATH=os.pathsep.join([str(REPO / 'tests' / 'fake_slurm'),
                                     os.path.dirname(sys.executable), os.environ['PATH']]))
    cmd = ['srun', '-p', 'cpu', '--job-name=mst-knn', '--ntasks=2', '--ntasks-per-node=2',
           '--kill-on-bad-exit=1', sys.executable, '-u', 'tools/analysis/knn_eval.py', config,
           str(ckpt), '--launcher', 'slurm', '--work-dir', str(tmp_path / 'w2'), '--out',
           str(tmp_path / 'two.json'), *options]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((tmp_path / 'two.json').read_text()) == {
        f'top1_k{k}': v for k, v in single.items()}
    log = result.stdout + result.stderr
    assert 'Distributed launcher: slurm' in log and 'GPU number: 2' in log  # 2 ranks
