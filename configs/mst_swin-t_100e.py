# MST, Swin-T, 100 epochs, ImageNet-1k train split, 8 GPUs x 128 (paper Table 1, Swin-T row:
# "Swin-T shares the same hyperparameters with DeiT-S").
#   tools/dist_train.sh configs/mst_swin-t_100e.py 8
_base_ = [
    '_base_/models/mst_swin-t.py',
    '_base_/datasets/imagenet_mst_multicrop.py',
    '_base_/schedules/mst_adamw_300e.py',
    '_base_/default_runtime.py',
]

max_epochs = 100
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=10, end=max_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min_ratio=10.0,
         by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs)
