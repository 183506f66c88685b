# MST, DeiT-S/16, 300 epochs, ImageNet-1k train split, 8 GPUs x 128 (paper Table 1).
#   bash tools/dist_train.sh configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py 8
_base_ = [
    '../_base_/models/mst_deit-s.py',
    '../_base_/datasets/imagenet_mst_multicrop.py',
    '../_base_/schedules/mst_adamw_300e.py',
    '../_base_/default_runtime.py',
]
