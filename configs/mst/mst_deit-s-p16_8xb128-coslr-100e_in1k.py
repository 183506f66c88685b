# MST, DeiT-S/16, 100 epochs (the paper's ablation schedule, Tables 4-6).
_base_ = [
    '../_base_/models/mst_deit-s.py',
    '../_base_/datasets/imagenet_mst_multicrop.py',
    '../_base_/schedules/mst_adamw_100e.py',
    '../_base_/default_runtime.py',
]
