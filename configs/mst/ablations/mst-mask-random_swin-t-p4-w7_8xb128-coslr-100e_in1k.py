# Swin-T with BERT-style masking (Eq. 3) of every last-stage cell with p = 0.1: the baseline
# that tells whether the Swin guidance helps at all.
_base_ = ['../mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py']
model = dict(mask_cfg=dict(mode='random', p=0.1))
