# Weighted k-NN of an MST DeiT-S checkpoint on ImageNet-1k (paper appendix, Table 7):
# train split as reference, val split as queries, 224 px centre crops of 256 px resizes.
#   torchrun --nproc_per_node 8 tools/analysis/knn_eval.py \
#       configs/benchmarks/knn/knn_deit-s_in1k.py CKPT --launcher pytorch
_base_ = [
    '../../_base_/datasets/imagenet_linear_probe.py',
    '../../_base_/default_runtime.py',
]

model = dict(
    type='FeatureEmbedder',
    weights='teacher',
    data_preprocessor=dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                           to_rgb=True),
    backbone=dict(type='VisionTransformer', arch='deit-small', img_size=224, patch_size=16,
                  out_type='cls_token'))

pipeline = {{_base_.test_pipeline}}
reference_dataloader = dict(
    batch_size=128, num_workers=8,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ImageNet', data_root='data/imagenet', split='train', pipeline=pipeline))
test_dataloader = dict(
    batch_size=128, num_workers=8,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ImageNet', data_root='data/imagenet', split='val', pipeline=pipeline))
test_cfg = dict(type='KNNTestLoop', train_dataloader=reference_dataloader)
test_evaluator = dict(_delete_=True, type='WeightedKNNAccuracy', ks=(10, 20, 100, 200),
                      temperature=0.07)
# Evaluation only: the base's training and validation splits would make mmengine's Runner
# expect a training and validation loop.
train_dataloader = None
val_dataloader = None
val_evaluator = None
