# Swin-T guidance ablation (ours; the paper does not say how it guides Swin-T): rank the
# last-stage cells by cosine similarity to the average token instead of by the attention
# of the average token (MaskSwin's default 'pooled_query').
_base_ = ['../mst_swin-t_100e.py']
model = dict(backbone=dict(guidance='pooled_similarity'))
