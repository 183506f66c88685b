# MST with a DeiT-S/16 backbone (paper Sec. 4.1). Every key is documented in docs/method.md,
# "Paper hyperparameters and the config keys that set them".
model = dict(
    type='MST',
    # The workers only cut and resize the crops (MultiCrop(crops_only=True) in
    # _base_/datasets/imagenet_mst_multicrop.py); flip, colour jitter, grey, blur and
    # solarisation run here, batched on the model's device, with MultiCrop's parameters.
    data_preprocessor=dict(
        type='MultiCropDataPreprocessor',
        multi_crop=dict(type='BatchViewAugment', blur_radius=(0.1, 2.0)),
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        to_rgb=True,
        non_blocking=True),        # the loader pins its memory: copies overlap the step
    backbone=dict(
        type='MaskViT',
        arch='deit-small',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.1,        # student only; the teacher is built without drop-path
        use_mask_token=True,
        dino_init=True,            # DINO's init: trunc. normal .02 Linear (zero bias), CLS, pos
        pos_embed_resize='size'),  # 96-px crops: mmpretrain's resize by size, as downstream
    neck=dict(
        type='DINONeck',
        in_channels=384,
        hidden_channels=2048,
        bottleneck_channels=256,
        out_channels=65536,
        num_layers=3,
        with_bn=True,              # Table 5: BN in the head, statistics from global views
        bn_statistics='global_crops',
        norm_last_layer=False),    # DINO's ViT-S recipe (--norm_last_layer false)
    head=dict(
        type='DINODistillHead',
        out_channels=65536,
        num_global_crops=2,
        student_temp=0.1,
        teacher_temp=0.04,         # warmed up to 0.07 by TeacherTempWarmupHook
        center_momentum=0.9,
        loss_weight=1.0),          # lambda_1 (Eq. 12)
    decoder_head=dict(
        type='ImageDecoderHead',
        in_channels=384,
        channels=(64, 32, 16, 8),  # four 2x stages: 14 -> 224 px; widths set by cost
        loss_weight=0.6),          # lambda_2 (Eq. 12)
    mask_cfg=dict(num=8, p=0.1, mode='attention'),  # Eq. 6
    num_global_crops=2,
    base_momentum=0.004,           # mmengine convention: DINO's teacher momentum 0.996
    end_momentum=0.0)              # ... cosine to 1.0
