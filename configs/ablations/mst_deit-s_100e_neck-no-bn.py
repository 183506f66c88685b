# Table 5, "w/o BN": DINO's projection head without BatchNorm.
_base_ = ['../mst_deit-s_100e.py']
model = dict(neck=dict(with_bn=False))
