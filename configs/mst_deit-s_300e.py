# The name users type (`python tools/train.py configs/mst_deit-s_300e.py`): the 300-epoch
# DeiT-S recipe, configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py, under a short name.
_base_ = ['./mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py']
