"""The Swin-T k-NN and linear-probe configs, run on a tiny Swin: both read the teacher's
last stage, normed and average-pooled, which is the feature MST pretrains."""
import json

import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401
from tests.helpers import REPO, load_tool, make_image_folder
from tests.test_evaluation.test_knn import hand_knn_top1
from tests.test_evaluation.test_linear_probe import one_step
from tests.test_models.test_backbones.test_mask_swin import TINY_SWIN, swin_mst

KNN = REPO / 'configs/benchmarks/knn/knn_swin-t_in1k.py'
LINEAR = REPO / 'configs/benchmarks/classification/linear_swin-t_avgpool_8xb128-100e_in1k.py'
TINY = {k: v for k, v in TINY_SWIN.items() if k in ('img_size', 'window_size', 'out_indices')}


def tiny_checkpoint(tmp_path):
    mst = swin_mst()
    with torch.no_grad():  # a teacher unlike the student and unlike a fresh init
        for p in mst.teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path / 'mst_swin.pth'
    torch.save({'state_dict': mst.state_dict()}, path)
    teacher = mst.teacher.module[0]
    teacher.eval()  # mmpretrain's SwinTransformer.train() returns None: no chaining
    return teacher, path


def tiny_knn_config(tmp_path, data_root) -> str:
    pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(32, 32)),
                dict(type='PackInputs')]

    def loader(split):
        return dict(batch_size=4, num_workers=0, persistent_workers=False, dataset=dict(
            _delete_=True, type='CustomDataset', data_root=f'{data_root}/{split}',
            pipeline=pipeline))
    path = tmp_path / 'knn_tiny_swin.py'
    arch = dict(_delete_=True, **TINY_SWIN['arch'])
    path.write_text(f'_base_ = [{str(KNN)!r}]\n'
                    f'model = dict(backbone=dict(**{TINY!r}, arch={arch!r}))\n'
                    f"test_dataloader = {loader('val')!r}\n"
                    f"test_cfg = dict(train_dataloader={loader('train')!r})\n")
    return str(path)


@pytest.mark.slow
def test_swin_knn_embeds_the_teachers_pooled_last_stage_and_runs(tmp_path):
    teacher, ckpt = tiny_checkpoint(tmp_path)
    # 32 x 32: the pipeline's Resize keeps them as they are, so they can be read by hand.
    make_image_folder(tmp_path / 'd' / 'train', classes=3, per_class=5, size=(32, 32))
    make_image_folder(tmp_path / 'd' / 'val', classes=3, per_class=4, size=(32, 32), seed=3)
    config = tiny_knn_config(tmp_path, tmp_path / 'd')

    embedder = MODELS.build(Config.fromfile(config).model)
    embedder.eval()
    embedder.load_state_dict(torch.load(ckpt, weights_only=True)['state_dict'])
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        embedding = embedder(x, mode='tensor')
        expected = teacher.forward_mst(x).global_feat
    assert embedding.shape == (3, 32)  # the last stage's channels, no spatial axes
    torch.testing.assert_close(embedding, expected)

    out = tmp_path / 'knn.json'
    result = load_tool('tools/analysis/knn_eval.py').main(
        [config, str(ckpt), '--ks', '1', '3', '--out', str(out),
         '--work-dir', str(tmp_path / 'w')])
    # The tool's numbers are the brute-force k-NN of the teacher's own pooled feature.
    assert result == pytest.approx(hand_knn_top1(lambda x: teacher.forward_mst(x).global_feat,
                                                 embedder.data_preprocessor, tmp_path / 'd',
                                                 ks=(1, 3)))
    assert json.loads(out.read_text()) == {f'top1_k{k}': v for k, v in result.items()}


def test_swin_linear_probe_loads_the_teacher_frozen_and_trains_its_head(tmp_path):
    teacher, ckpt = tiny_checkpoint(tmp_path)
    cfg = Config.fromfile(str(LINEAR))
    backbone = cfg.model.backbone
    assert backbone.type == 'MaskSwin' and cfg.model.neck.type == 'GlobalAveragePooling'
    backbone.update(TINY, arch=TINY_SWIN['arch'], frozen_stages=1)
    backbone.init_cfg.checkpoint = str(ckpt)
    cfg.model.head.update(in_channels=32, num_classes=4)
    model = MODELS.build(cfg.model)
    model.init_weights()
    expected = {k: v for k, v in teacher.state_dict().items() if k != 'mask_token'}
    assert set(model.backbone.state_dict()) == set(expected)
    for k, v in model.backbone.state_dict().items():
        torch.testing.assert_close(v, expected[k], msg=k)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.extract_feat(x)[-1], teacher.forward_mst(x).global_feat)
    model.train()
    one_step(model, cfg.optim_wrapper, 32, num_classes=4)
