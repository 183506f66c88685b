# Attention-guided masking without the global image decoder (lambda_2 = 0).
_base_ = ['../mst_deit-s_100e.py']
model = dict(decoder_head=None)
