# SETR-Naive with a DeiT-S backbone on Cityscapes 768 x 768, 40k iterations (paper Table 3),
# from an MST checkpoint. mmseg's stock SETR config with ViT-L's dimensions replaced by
# DeiT-S's (384 channels, 12 layers, 6 heads) and the 40k schedule.
#
#   python tools/model_converters/mst2downstream.py \
#       work_dirs/mst_deit-s-p16_8xb128-coslr-100e_in1k/epoch_100.pth pretrain/mst_deit-s_mmseg.pth --target mmseg
#   tools/dist_train.sh \
#       configs/benchmarks/mmsegmentation/setr_mst-deit-s_naive_8xb1-40k_cityscapes-768x768.py 8
_base_ = 'mmseg::setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py'

# mst_mm makes every checkpoint load weights-only (mst_mm.engine.safe_loading).
custom_imports = dict(imports=['mst_mm'], allow_failed_imports=False)

pretrained = 'pretrain/mst_deit-s_mmseg.pth'
embed_dims = 384
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(
        embed_dims=embed_dims,
        num_layers=12,
        num_heads=6,
        # SETR-L taps layers 10, 15, 20 and 24 of 24; for 12 layers we take what mmseg's
        # ViT-B / DeiT-S UperNet configs tap, every third layer. The decode head reads the last.
        out_indices=(2, 5, 8, 11),
        # DeiT's patch embedding has a bias and its last layer a final LayerNorm; mmseg's
        # defaults (False, False) would drop both without a word (strict=False loading).
        patch_bias=True,
        final_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=embed_dims),
    auxiliary_head=[
        dict(type='SETRUPHead', in_channels=embed_dims, channels=256, in_index=index,
             num_classes=19, dropout_ratio=0, norm_cfg=norm_cfg, num_convs=1, up_scale=4,
             kernel_size=1, align_corners=False,
             loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4))
        for index in range(3)
    ])

# mmseg's schedule_40k: poly decay over 40k iterations, validation and checkpoints every 4k.
max_iters = 40000
param_scheduler = [
    dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, end=max_iters, by_epoch=False)
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=4000)
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=4000))
