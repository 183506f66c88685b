# Table 4, "None": no masking; the decoder stays on.
_base_ = ['../mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(mask_cfg=dict(mode='none'))
