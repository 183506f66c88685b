# Linear probe on a frozen MST Swin-T: the teacher's last stage, normed and average-pooled
# (the feature MST pretrains and Swin's classifier pools; see knn_swin-t_in1k.py).
# Otherwise as linear_deit-s_cls-last_8xb128-100e_in1k.py:
#   bash tools/dist_train.sh configs/benchmarks/classification/linear_swin-t_avgpool_8xb128-100e_in1k.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k/epoch_100.pth
_base_ = ['linear_deit-s_cls-last_8xb128-100e_in1k.py']

checkpoint = 'work_dirs/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k/epoch_100.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='MaskSwin',
        arch='tiny',
        img_size=224,
        out_indices=(3, ),
        pad_small_map=True,         # as in pretraining: see knn_swin-t_in1k.py
        use_mask_token=False,
        frozen_stages=3,            # all four stages and the last stage's norm
        init_cfg=dict(type='CheckedPretrained', checkpoint=checkpoint, prefix='teacher.module.0.')),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(in_channels=768))
