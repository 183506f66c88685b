_base_ = ['mmpretrain::_base_/default_runtime.py']

# Importing mst_mm registers its modules into mmpretrain's registries.
custom_imports = dict(imports=['mst_mm'], allow_failed_imports=False)
default_scope = 'mmpretrain'

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    # A kill during a save never costs the previous checkpoint (mst_mm SafeCheckpointHook).
    checkpoint=dict(type='SafeCheckpointHook', interval=10, max_keep_ckpts=3),
    # RNG states in every checkpoint: a resumed run repeats the uninterrupted one exactly
    # (with the dataloaders' worker_init_from_torch_seed and non-persistent workers).
    random_state=dict(type='RandomStateHook'),
)
log_processor = dict(window_size=50)

# DDP: BN layers of neck and decoder become SyncBN (paper appendix "BatchNorm"), and the
# projection's last layer gets no gradient during its frozen first epoch, hence
# find_unused_parameters. DeviceAgnosticDDP is mmengine's wrapper, also usable on CPU (gloo).
sync_bn = 'torch'
model_wrapper_cfg = dict(type='DeviceAgnosticDDP', broadcast_buffers=False,
                         find_unused_parameters=True)
