# Table 4, "Random Mask": BERT-style masking (Eq. 3) of every patch with the same p = 0.1.
_base_ = ['../mst_deit-s_100e.py']
model = dict(mask_cfg=dict(mode='random', p=0.1))
