# Table 4, "None": no masking; the decoder stays on.
_base_ = ['../mst_deit-s_100e.py']
model = dict(mask_cfg=dict(mode='none'))
