# Table 5 "Baseline w/ BN": DINO with BatchNorm in the projection head as DINO's
# `--use_bn_in_head true` has it: one BN pass over all crops together (statistics from the
# global and the local crops), unlike MST's rule (running statistics from global views only).
_base_ = ['dino_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(neck=dict(with_bn=True, bn_statistics='all_crops'))
