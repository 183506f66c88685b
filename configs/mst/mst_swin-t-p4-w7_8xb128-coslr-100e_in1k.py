# MST, Swin-T, 100 epochs, ImageNet-1k train split, 8 GPUs x 128 (paper Table 1, Swin-T row:
# "Swin-T shares the same hyperparameters with DeiT-S").
#   bash tools/dist_train.sh configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py 8
_base_ = [
    '../_base_/models/mst_swin-t.py',
    '../_base_/datasets/imagenet_mst_multicrop.py',
    '../_base_/schedules/mst_adamw_100e.py',
    '../_base_/default_runtime.py',
]
