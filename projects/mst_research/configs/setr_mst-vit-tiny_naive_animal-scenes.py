# SETR-Naive on the animal scenes (the evidence run's segmentation transfer, projects/mst_research/tools/evidence.py),
# from the ViT-tiny of configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py (48 channels,
# 4 layers, 3 heads, 4-px patches, pretrained on 32-px crops). The scenes are 64 x 64 grey
# canvases with 1-4 animals; their label maps hold 0 = background and 1-10 = the animals:
#   python -c "from mst_research.data import write_scenes; \
#              write_scenes('data/animal_shapes/scenes')"
# mmseg's stock SETR-Naive with ViT-L's dimensions replaced by the ViT-tiny's, BN for SyncBN
# (one CPU process), 32-channel heads, a down-weighted background class and 500 iterations of
# 8 scenes (10 epochs of the 400 train scenes). mst_research.transfer.finetune runs it in
# about 2.5 minutes with validation on one CPU core (159 s measured beside other jobs); from
# random init mIoU 12.2 (seed 0: background IoU 96, the animal classes 0-11).
#
#   python tools/model_converters/mst2downstream.py WORK_DIR/epoch_N.pth \
#       pretrain/mst_vit-tiny_mmseg.pth --target mmseg \
#       --config projects/mst_research/configs/setr_mst-vit-tiny_naive_animal-scenes.py
#   python tools/train.py projects/mst_research/configs/setr_mst-vit-tiny_naive_animal-scenes.py
_base_ = 'mmseg::setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py'

# mst_mm makes every checkpoint load weights-only (mst_mm.engine.safe_loading).
custom_imports = dict(imports=['mst_mm'], allow_failed_imports=False)

data_root = 'data/animal_shapes/scenes/'
classes = ('background', 'bear', 'bird', 'cat', 'cow', 'dog', 'elephant', 'giraffe', 'horse',
           'sheep', 'zebra')
palette = [[0, 0, 0], [230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200],
           [245, 130, 48], [145, 30, 180], [70, 240, 240], [240, 50, 230], [210, 245, 60],
           [250, 190, 212]]
pretrained = 'pretrain/mst_vit-tiny_mmseg.pth'
crop_size = (64, 64)     # the scenes' size: 16 x 16 patches; the converter resizes the
embed_dims = 48          # 8 x 8 position embedding of the 32-px pretraining to this grid
num_classes = len(classes)
norm_cfg = dict(type='BN', requires_grad=True)   # one CPU process: no SyncBN
# Background is 82 % of the pixels, each animal class about 2 %. With plain cross-entropy a
# model that finds the animals but cannot yet tell them apart splits an animal pixel's
# probability over ten classes, each below the background's, and predicts background
# everywhere (mIoU 7.5 = background IoU / 11, seen here from random init at lr 1e-4, 5e-4
# and 1e-3). Weighting background by 0.1 makes it predict the animals it finds.
class_weight = [0.1] + [1.0] * 10
max_iters = 500
batch_size = 8
head_channels = 32

model = dict(
    # the normalisation of the MST pretraining (grey scenes: the channel order is moot)
    data_preprocessor=dict(mean=[127.5] * 3, std=[64.0] * 3, size=crop_size),
    backbone=dict(
        img_size=crop_size,
        patch_size=4,
        embed_dims=embed_dims,
        num_layers=4,
        num_heads=3,
        mlp_ratio=4,             # 192 hidden channels, as the ViT-tiny
        # SETR taps four layers and decodes the last; the ViT-tiny has four.
        out_indices=(0, 1, 2, 3),
        drop_rate=0.,
        drop_path_rate=0.1,
        # mmpretrain's ViT has a patch-embedding bias and a final LayerNorm; mmseg's
        # defaults (False, False) would drop both without a word (strict=False loading).
        patch_bias=True,
        final_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    # Naive: a 1x1 conv, BN, ReLU and a 4x upsampling from the 16 x 16 grid to 64 px.
    decode_head=dict(in_channels=embed_dims, channels=head_channels, num_classes=num_classes,
                     norm_cfg=norm_cfg,
                     loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                                      loss_weight=1.0, class_weight=class_weight)),
    auxiliary_head=[
        dict(type='SETRUPHead', in_channels=embed_dims, channels=head_channels, in_index=index,
             num_classes=num_classes, dropout_ratio=0, norm_cfg=norm_cfg, num_convs=1,
             up_scale=4, kernel_size=1, align_corners=False,
             loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4,
                              class_weight=class_weight))
        for index in range(3)
    ],
    test_cfg=dict(_delete_=True, mode='whole'))

dataset_type = 'BaseSegDataset'
metainfo = dict(classes=classes, palette=palette)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        _delete_=True,
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        img_suffix='.png',
        seg_map_suffix='.png',
        reduce_zero_label=False,
        data_prefix=dict(img_path='train', seg_map_path='labels/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=batch_size,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        _delete_=True,
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        img_suffix='.png',
        seg_map_suffix='.png',
        reduce_zero_label=False,
        data_prefix=dict(img_path='val', seg_map_path='labels/val'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

# AdamW (the stock SGD at lr 0.01 is made for 40k+ steps), heads at 10x as in the stock
# config, no weight decay on norms and position / class embeddings.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=5e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'head': dict(lr_mult=10.),
        'pos_embed': dict(decay_mult=0.),
        'cls_token': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
        'ln': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=0., power=1.0, by_epoch=False, begin=30, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(interval=50),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
