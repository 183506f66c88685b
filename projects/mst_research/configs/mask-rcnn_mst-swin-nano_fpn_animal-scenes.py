# Mask R-CNN with FPN on the animal scenes (the evidence run's detection transfer,
# projects/mst_research/tools/evidence.py), from the MaskSwin-nano of
# projects/mst_research/configs/mst_swin-nano-p4-w4_1xb64-coslr-6e_animals.py. The scenes
# are 64 x 64 grey canvases with 1-4 animals covering 4-12 % of the canvas each (13-22 px
# across), written by
#   python -c "from mst_research.data import write_scenes; \
#              write_scenes('data/animal_shapes/scenes')"
# mmdet's Swin-T Mask R-CNN config, scaled to a CPU: the nano backbone, narrower FPN and heads,
# fewer proposals and RoI samples, and 400 iterations of 4 scenes (4 epochs of the 400 train
# scenes). mst_research.transfer.finetune runs it in about 3.5 minutes with validation on
# one CPU core (215 s measured beside other jobs); from random init box / mask mAP
# 0.095 / 0.099 (seed 0).
#
#   python tools/model_converters/mst2downstream.py WORK_DIR/epoch_N.pth \
#       pretrain/mst_swin-nano_mmdet.pth --target mmdet \
#       --config projects/mst_research/configs/mask-rcnn_mst-swin-nano_fpn_animal-scenes.py
#   python tools/train.py projects/mst_research/configs/mask-rcnn_mst-swin-nano_fpn_animal-scenes.py
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

# mst_mm makes every checkpoint load weights-only (mst_mm.engine.safe_loading).
custom_imports = dict(imports=['mst_mm'], allow_failed_imports=False)

data_root = 'data/animal_shapes/scenes/'
classes = ('bear', 'bird', 'cat', 'cow', 'dog', 'elephant', 'giraffe', 'horse', 'sheep',
           'zebra')
pretrained = 'pretrain/mst_swin-nano_mmdet.pth'
# The scenes are upscaled 2x. At 64 px the stride-4 level of the FPN would be 16 x 16 and an
# animal 3-5 cells across, too coarse for the 14 x 14 mask RoIs and below the smallest stock
# anchor (32 px). At 128 px the animals are 26-44 px, the size of the stock anchors of the
# stride-4 and stride-8 levels (32 and 64 px), and 7-11 cells across at stride 4. From random
# init (a 64-wide nano), 300 iterations of 8 scenes reached box mAP 0.022 at 64 px (anchor
# scale 4), 200 of 8 at 128 px 0.081 in about the same time, 400 of 4 at 128 px 0.09-0.10.
scale = (128, 128)
embed_dims = 48          # the nano's width: stages of 48 and 96 channels (strides 4 and 8)
fpn_channels = 64
max_iters = 400
batch_size = 4

model = dict(
    data_preprocessor=dict(
        # the normalisation of the MST pretraining (grey scenes: the channel order is moot)
        mean=[127.5] * 3, std=[64.0] * 3, bgr_to_rgb=True, pad_size_divisor=32),
    backbone=dict(
        embed_dims=embed_dims,
        depths=[2, 4],
        num_heads=[3, 6],
        strides=(4, 2),
        window_size=4,
        drop_path_rate=0.1,
        out_indices=(0, 1),
        # The converter writes mmdet's own key names: the stock `convert_weights=True`
        # expects the original Swin repository's names and would rename ours wrongly.
        convert_weights=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    # Two backbone levels (strides 4, 8); FPN max-pools three more (16, 32, 64), so the
    # stock anchor strides and the RoI extractors' [4, 8, 16, 32] stay as they are.
    neck=dict(in_channels=[embed_dims, embed_dims * 2], out_channels=fpn_channels, num_outs=5),
    rpn_head=dict(in_channels=fpn_channels, feat_channels=fpn_channels),
    roi_head=dict(
        # torchvision's RoIAlign (same result, aligned=True): its CPU backward is about twice
        # as fast as mmcv's, which was the largest single cost of a step.
        bbox_roi_extractor=dict(roi_layer=dict(use_torchvision=True), out_channels=fpn_channels),
        bbox_head=dict(in_channels=fpn_channels, fc_out_channels=256, num_classes=len(classes)),
        mask_roi_extractor=dict(roi_layer=dict(use_torchvision=True), out_channels=fpn_channels),
        mask_head=dict(num_convs=2, in_channels=fpn_channels, conv_out_channels=fpn_channels,
                       num_classes=len(classes))),
    # At most 4 animals per scene: far fewer proposals and RoI samples than COCO's.
    train_cfg=dict(
        rpn=dict(sampler=dict(num=64)),
        rpn_proposal=dict(nms_pre=200, max_per_img=100),
        rcnn=dict(sampler=dict(num=32))),
    test_cfg=dict(
        rpn=dict(nms_pre=200, max_per_img=100),
        rcnn=dict(max_per_img=20)))

metainfo = dict(classes=classes)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=0),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=batch_size,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json',
                     metric=['bbox', 'segm'])
test_evaluator = val_evaluator

# AdamW as the stock Swin config (no weight decay on norms and position biases), with a
# short warm-up and a cosine decay over the iteration schedule.
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.05))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=50, end=max_iters),
]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
