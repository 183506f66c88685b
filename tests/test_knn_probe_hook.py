"""KNNProbeHook: the k-NN probe of the teacher during pretraining."""
import pytest
import torch
from mmengine.runner import Runner

from mst_mm.engine.hooks import KNNProbeHook
from mst_mm.evaluation import knn_top1
from tests.helpers import make_image_folder, scalars, tiny_runner_cfg


def probe_loader(root: str) -> dict:
    return dict(batch_size=5, dataset=dict(
        type='CustomDataset', data_root=root,
        pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')]))


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

    # The last logged value is the k-NN of the final teacher, recomputed here by hand.
    hook = next(h for h in runner.hooks if isinstance(h, KNNProbeHook))
    model = runner.model
    backbone = model.teacher.module[0]
    feats = {}
    for split in ('reference', 'query'):
        feats[split] = hook._embed(model, backbone, split)
    expected = knn_top1(*feats['reference'], *feats['query'], ks=(1, 3))
    assert rows[-1]['knn_probe_top1_k1'] == pytest.approx(expected[1])
    assert rows[-1]['knn_probe_top1_k3'] == pytest.approx(expected[3])
    # The embedding is the teacher's CLS output on the training normalisation (RGB order).
    image = torch.stack([hook._datasets['query'][0]['inputs']]).float()[:, [2, 1, 0]]
    mean = model.data_preprocessor.mean.reshape(1, -1, 1, 1)
    std = model.data_preprocessor.std.reshape(1, -1, 1, 1)
    with torch.no_grad():
        direct = backbone.forward_mst((image - mean) / std).global_feat
    torch.testing.assert_close(feats['query'][0][:1], direct)
    assert feats['query'][1].tolist() == [0, 0, 0, 1, 1, 1]


def test_probe_rejects_bad_arguments():
    with pytest.raises(ValueError, match='interval'):
        KNNProbeHook(reference_dataloader={}, query_dataloader={}, interval=0)
    with pytest.raises(ValueError, match='teacher'):
        KNNProbeHook(reference_dataloader={}, query_dataloader={}, weights='ema')
