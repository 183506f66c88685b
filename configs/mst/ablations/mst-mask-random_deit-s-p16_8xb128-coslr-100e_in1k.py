# Table 4, "Random Mask": BERT-style masking (Eq. 3) of every patch with the same p = 0.1.
_base_ = ['../mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(mask_cfg=dict(mode='random', p=0.1))
