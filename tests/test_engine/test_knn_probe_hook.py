"""KNNProbeHook: the k-NN probe of the teacher during pretraining."""
from pathlib import Path

import mmcv
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.runner import Runner

from mst_mm.engine.hooks import KNNProbeHook
from tests.helpers import make_image_folder, scalars, tiny_runner_cfg


def probe_loader(root: str) -> dict:
    return dict(batch_size=5, dataset=dict(
        type='CustomDataset', data_root=root,
        pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')]))


def teacher_features(teacher, preprocessor, root: str):
    """CLS features of the sorted class folders, read with PIL (RGB) and normalised by hand."""
    paths = sorted(Path(root).glob('*/*.png'))
    images = torch.from_numpy(np.stack([mmcv.imread(str(p), channel_order='rgb')
                                        for p in paths])).permute(0, 3, 1, 2).float()
    mean = preprocessor.mean.reshape(1, 3, 1, 1)
    std = preprocessor.std.reshape(1, 3, 1, 1)
    teacher.eval()
    with torch.no_grad():
        feats = teacher.forward_mst((images - mean) / std).global_feat
    labels = torch.tensor([int(p.parent.name.split('_')[1]) for p in paths])
    return feats, labels


def knn_top1_by_hand(train, train_labels, query, query_labels, k, t=0.07) -> float:
    """Cosine similarity, top-k neighbours, votes exp(s / T) per class, argmax."""
    sims = F.normalize(query, dim=1) @ F.normalize(train, dim=1).t()
    top = sims.topk(k, dim=1)
    votes = torch.zeros(len(query), int(train_labels.max()) + 1)
    votes.scatter_add_(1, train_labels[top.indices], (top.values / t).exp())
    return float((votes.argmax(1) == query_labels).float().mean() * 100)


@pytest.mark.slow
def test_probe_logs_the_teachers_knn_before_training_and_after_every_epoch(tmp_path):
    train = make_image_folder(tmp_path / 'train', classes=2, per_class=6, size=(32, 32))
    query = make_image_folder(tmp_path / 'query', classes=2, per_class=3, size=(32, 32), seed=1)
    cfg = tiny_runner_cfg(train, tmp_path / 'work', max_epochs=2)
    cfg.custom_hooks.append(dict(type='KNNProbeHook', ks=(1, 3),
                                 reference_dataloader=probe_loader(train),
                                 query_dataloader=probe_loader(query)))
    runner = Runner.from_cfg(cfg)
    runner.train()

    rows = [r for r in scalars(tmp_path / 'work') if 'knn_probe_top1_k1' in r]
    iters_per_epoch = len(runner.train_dataloader)
    assert [r['step'] for r in rows] == [0, iters_per_epoch, 2 * iters_per_epoch]

    # The last logged value is the k-NN of the final teacher's CLS output on the training
    # normalisation (RGB order), recomputed here without the hook's code.
    teacher = runner.model.teacher.module[0]
    preprocessor = runner.model.data_preprocessor
    reference = teacher_features(teacher, preprocessor, train)
    queries = teacher_features(teacher, preprocessor, query)
    assert queries[1].tolist() == [0, 0, 0, 1, 1, 1]
    hook = next(h for h in runner.hooks if isinstance(h, KNNProbeHook))
    torch.testing.assert_close(hook._embed(runner.model, teacher, 'query')[0], queries[0])
    for k in (1, 3):
        assert rows[-1][f'knn_probe_top1_k{k}'] == pytest.approx(
            knn_top1_by_hand(*reference, *queries, k))


def test_probe_rejects_bad_arguments():
    with pytest.raises(ValueError, match='interval'):
        KNNProbeHook(reference_dataloader={}, query_dataloader={}, interval=0)
    with pytest.raises(ValueError, match='teacher'):
        KNNProbeHook(reference_dataloader={}, query_dataloader={}, weights='ema')
