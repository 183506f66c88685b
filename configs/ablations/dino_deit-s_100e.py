# The DINO baseline on the same recipe: no masking, no decoder (Table 5, "Baseline").
_base_ = ['../mst_deit-s_100e.py']
model = dict(mask_cfg=dict(mode='none'), decoder_head=None)
