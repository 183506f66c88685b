# Table 5 "Baseline w/o BN": DINO on the same recipe (no masking, no decoder) with DINO's
# default projection head, which has no BatchNorm (`--use_bn_in_head false`).
_base_ = ['../mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(mask_cfg=dict(mode='none'), decoder_head=None, neck=dict(with_bn=False))
