# Table 5, "w/o BN": DINO's projection head without BatchNorm.
_base_ = ['../mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(neck=dict(with_bn=False))
