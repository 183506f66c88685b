# MST with a Swin-T backbone (paper Sec. 4.2, Table 1: same hyperparameters as DeiT-S).
# Swin has no CLS token: the mask and its guidance live on the last stage's 7 x 7 grid
# (stride 32), see MaskSwin. Every other key is the DeiT-S model's.
_base_ = ['mst_deit-s.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='MaskSwin',
        arch='tiny',               # 96 channels, depths (2, 2, 6, 2), 28M parameters
        img_size=224,
        window_size=7,
        drop_path_rate=0.1,        # student only; the teacher is built without drop-path
        # 96-px local crops make 3 x 3 last-stage maps, smaller than the 7 x 7 window:
        # pad them to the window, as mmdet's Swin does for every input downstream.
        pad_small_map=True,
        out_indices=(3, ),
        guidance='pooled_query',   # or 'pooled_similarity' (ablation), see MaskSwin
        use_mask_token=True),
    neck=dict(in_channels=768),    # the average of the last stage's tokens
    decoder_head=dict(
        in_channels=768,
        # five 2x stages: the last stage's 7 x 7 map (stride 32) back to 224 px
        channels=(128, 64, 32, 16, 8)))
