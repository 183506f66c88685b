# Foundation smoke run: mmpretrain's own MoCoV3 on a tiny ViT, two epochs on the demo data.
# It proves that the stack trains end to end; the MST demo replaces it.
_base_ = ['../_base_/default_runtime.py']

model = dict(
    type='MoCoV3',
    base_momentum=0.01,
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[64.] * 3,
                           to_rgb=True),
    backbone=dict(type='MoCoV3ViT', arch=dict(embed_dims=96, num_layers=4, num_heads=4,
                                              feedforward_channels=384),
                  img_size=32, patch_size=4, stop_grad_conv1=True),
    neck=dict(type='NonLinearNeck', in_channels=96, hid_channels=256, out_channels=64,
              num_layers=3, with_bias=False, with_last_bn=True, with_last_bn_affine=False,
              with_last_bias=False, with_avg_pool=False),
    head=dict(type='MoCoV3Head',
              predictor=dict(type='NonLinearNeck', in_channels=64, hid_channels=256,
                             out_channels=64, num_layers=2, with_bias=False,
                             with_last_bn=True, with_last_bn_affine=False,
                             with_last_bias=False, with_avg_pool=False),
              loss=dict(type='CrossEntropyLoss', loss_weight=2 * 0.2),
              temperature=0.2))

view = [
    dict(type='RandomResizedCrop', scale=32, crop_ratio_range=(0.2, 1.), backend='pillow'),
    dict(type='RandomFlip', prob=0.5),
]
train_dataloader = dict(
    batch_size=64, num_workers=2, persistent_workers=True, drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='CustomDataset', data_root='data/mst_demo/train', pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='MultiView', num_views=2, transforms=[view]),
        dict(type='PackInputs')]))
optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05))
param_scheduler = [dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=2)]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=2)
default_hooks = dict(logger=dict(interval=5), checkpoint=dict(interval=2))
randomness = dict(seed=0)
