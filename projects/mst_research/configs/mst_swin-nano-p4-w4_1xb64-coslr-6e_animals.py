# The evidence recipe's Swin (projects/mst_research/tools/evidence.py): MST on a small MaskSwin, pretrained on the
# same 8,000 animal silhouettes, schedule and hooks as the ViT-tiny of
# configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py; only the model differs. Its teacher is what
# Mask R-CNN fine-tunes on the scenes
# (projects/mst_research/configs/mask-rcnn_mst-swin-nano_fpn_animal-scenes.py).
#
# Two stages, not Swin-T's four: MaskSwin masks and guides on the last stage's grid, and the
# rule takes the lowest N // num cells as candidates (num = 8). On a 32-px crop with 4-px
# patches, a third stage would leave a 2 x 2 grid, N // 8 = 0 candidates, and nothing would
# ever be masked; two stages leave 4 x 4 cells (stride 8), 2 candidates per crop, the same
# share p / num as the ViT's 64 patches. 16-px local crops give a 2 x 2 last stage, padded to
# the 4 x 4 window (pad_small_map). The width is the ViT's (48) and the heads are 16 wide as
# the ViT's; the depth (2, 4) makes an iteration cost about what the ViT's does (0.78-0.83 s
# against 0.70-0.85 s at batch 64 on one core of the 2-core CPU).
_base_ = ['../../../configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py']

embed_dims = 48
last_channels = embed_dims * 2   # one patch merging doubles the width

model = dict(
    backbone=dict(
        _delete_=True,
        type='MaskSwin',
        arch=dict(embed_dims=embed_dims, depths=[2, 4], num_heads=[3, 6]),
        img_size=32,
        patch_size=4,
        window_size=4,
        drop_path_rate=0.1,        # student only; the teacher is built without drop-path
        pad_small_map=True,
        out_indices=(1, ),
        guidance='pooled_query',
        use_mask_token=True),
    neck=dict(in_channels=last_channels),
    # three 2x stages: the last stage's 4 x 4 map (stride 8) back to 32 px
    decoder_head=dict(in_channels=last_channels, channels=(32, 16, 8)))
