# DINO's optimisation for ViT-S (paper Sec. 4.1): AdamW, lr 5e-4 x batch / 256 with 10 linear
# warm-up epochs then cosine; weight decay cosine 0.04 -> 0.4, none on biases, norms and the
# [MASK] token; gradient clipping 3.0; last layer frozen in epoch 1; teacher temperature
# 0.04 -> 0.07 over 30 epochs. A shorter schedule re-states the three entries that use
# `max_epochs` (see mst_adamw_100e.py): a child config cannot re-evaluate them.
max_epochs = 300
warmup_epochs = 10
base_lr = 2e-3  # 5e-4 * 1024 / 256

optim_wrapper = dict(
    # DINO's gradient rules: per-parameter clipping, and the frozen last layer's gradient
    # cancelled before the update (FreezeLastLayerHook).
    type='DINOOptimWrapper',
    # Mixed precision on a GPU, as DINO's --use_fp16 default: bfloat16 where the GPU has it,
    # else float16 with loss scaling; float32 on a CPU. None: float32 (TF32 on a GPU).
    mixed_precision='auto',
    # mmengine's constructor, without a warning for each EMA-teacher parameter (the
    # optimiser never sees them either way): the same parameter groups.
    constructor='StudentOptimWrapperConstructor',
    # fused=True: torch's one-kernel AdamW (CPU and CUDA), the same update as the default
    # per-tensor loop in a fifth of the time here (projects/mst_research/tools/benchmark.py).
    optimizer=dict(type='AdamW', lr=base_lr, betas=(0.9, 0.999), weight_decay=0.04,
                   fused=True),
    # Each parameter's own gradient norm clipped to 3.0, as DINO's `clip_gradients`;
    # mmengine's global-norm clipping stays available as dict(type='norm', max_norm=3.0).
    clip_grad=dict(type='per_param', max_norm=3.0),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={'mask_token': dict(decay_mult=0.0)}))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=warmup_epochs,
         end=max_epochs, convert_to_iter_based=True),
    # eta_min_ratio scales every group from its own start, so groups without weight
    # decay stay at 0 (mmengine's eta_min would set them all to one value).
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min_ratio=10.0,
         by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True),
]

train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs)
custom_hooks = [
    dict(type='TeacherTempWarmupHook', start=0.04, end=0.07, warmup_epochs=30),
    dict(type='FreezeLastLayerHook', freeze_epochs=1),
    # Input, teacher attention, masks and reconstruction of two crops, to the visualizer's
    # backends (add TensorboardVisBackend to vis_backends to see them there).
    dict(type='MSTVisualizationHook', interval=5000, num_images=2),
]
# 8 GPUs x 128 images; `--auto-scale-lr` rescales lr for other batch sizes.
auto_scale_lr = dict(base_batch_size=1024, enable=False)
