# Attention-guided masking without the global image decoder (lambda_2 = 0).
_base_ = ['../mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(decoder_head=None)
