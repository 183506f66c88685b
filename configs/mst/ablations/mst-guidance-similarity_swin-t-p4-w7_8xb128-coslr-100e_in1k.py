# Swin-T guidance ablation (ours; the paper does not say how it guides Swin-T): rank the
# last-stage cells by cosine similarity to the average token instead of by the attention
# of the average token (MaskSwin's default 'pooled_query').
_base_ = ['../mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py']
model = dict(backbone=dict(guidance='pooled_similarity'))
