# MST, ViT-B/16, 100 epochs: the DeiT-S recipe on mmpretrain's ViT-Base, which has the
# layout of DINO's vit_base (768 wide, 12 blocks of 12 heads, qkv bias, LayerNorm eps 1e-6,
# class token, 14 x 14 patches at 224 px), so that tools/model_converters/dino2mst.py starts
# it from DINO's ViT-B/16. The paper trains DeiT-S and Swin-T only: no result of its is for
# this config. The neck keeps the recipe's BN; DINO's ViT-B head (no BN) carries over with
# `--cfg-options model.neck.with_bn=False` (to both dino2mst.py and tools/train.py).
_base_ = ['mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(
    backbone=dict(arch='base'),
    neck=dict(in_channels=768, norm_last_layer=True),  # DINO's ViT-B: norm_last_layer true
    decoder_head=dict(in_channels=768))
