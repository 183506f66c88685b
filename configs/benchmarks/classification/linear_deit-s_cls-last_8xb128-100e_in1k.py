# Linear probe on the last layer's CLS token of a frozen MST DeiT-S (paper ablations).
# The MST checkpoint's EMA teacher is loaded directly (prefix 'teacher.module.0.'):
#   bash tools/dist_train.sh configs/benchmarks/classification/linear_deit-s_cls-last_8xb128-100e_in1k.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/mst_deit-s-p16_8xb128-coslr-300e_in1k/epoch_300.pth
_base_ = [
    '../../_base_/datasets/imagenet_linear_probe.py',
    '../../_base_/schedules/linear_probe_sgd_100e.py',
    '../../_base_/default_runtime.py',
]
checkpoint = 'work_dirs/mst_deit-s-p16_8xb128-coslr-300e_in1k/epoch_300.pth'
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='MaskViT',
        arch='deit-small',
        img_size=224,
        patch_size=16,
        use_mask_token=False,
        out_type='cls_token',
        frozen_stages=12,
        init_cfg=dict(type='CheckedPretrained', checkpoint=checkpoint, prefix='teacher.module.0.')),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=384,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.01)))
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook', interval=10, max_keep_ckpts=3))
