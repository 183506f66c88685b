# Swin-T with BERT-style masking (Eq. 3) of every last-stage cell with p = 0.1: the baseline
# that tells whether the Swin guidance helps at all.
_base_ = ['../mst_swin-t_100e.py']
model = dict(mask_cfg=dict(mode='random', p=0.1))
