_base_ = ['mmpretrain::_base_/default_runtime.py']

# Importing mst_mm registers its modules into mmpretrain's registries.
custom_imports = dict(imports=['mst_mm'], allow_failed_imports=False)
default_scope = 'mmpretrain'
# mmengine's Runner, loading weights-only and refusing a load_from or resume that leaves
# weights out (mst_mm CheckedRunner); tools/train.py (ours and mmpretrain's) build it.
runner_type = 'CheckedRunner'

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    # A kill during a save never costs the previous checkpoint (mst_mm SafeCheckpointHook).
    # Kept: epoch_N.pth every 10 epochs, the last 3. Rolling: latest.pth rewritten every
    # epoch (latest_interval), which --resume picks up, so a pre-emption costs at most one
    # epoch. For long epochs count it in iterations: latest_interval=2000,
    # latest_by_epoch=False (needs train_cfg.type='MidEpochResumeTrainLoop', which the MST
    # schedules set).
    checkpoint=dict(type='SafeCheckpointHook', interval=10, max_keep_ckpts=3,
                    latest_interval=1, latest_by_epoch=True),
    # A random stream per rank (crops, masks, drop-path), and every rank's RNG states in each
    # checkpoint: a resumed run repeats the uninterrupted one exactly on every rank (with the
    # dataloaders' worker_init_from_torch_seed and non-persistent workers). Keep mmengine's
    # randomness.diff_rank_seed=False: the hook docstring says why.
    random_state=dict(type='RandomStateHook'),
    # Warns when the DINO loss sits in uniform or one-hot collapse (teacher entropy and
    # teacher-student KL, logged every iteration); never stops a run.
    collapse_monitor=dict(type='CollapseMonitorHook', window=1000),
    # Logs the scheduled weight decay (`wd`, as DINO) and the EMA teacher's momentum.
    schedule_logger=dict(type='ScheduleLoggerHook'),
)
log_processor = dict(window_size=50)

# DDP: BN layers of neck and decoder become SyncBN (paper appendix "BatchNorm"). Every
# parameter takes part in every backward (the frozen last layer too: its gradient is
# cancelled in the optimiser wrapper, as DINO does), so DDP needs no search for unused
# parameters. DeviceAgnosticDDP is mmengine's wrapper, also usable on CPU (gloo).
sync_bn = 'torch'
model_wrapper_cfg = dict(type='DeviceAgnosticDDP', broadcast_buffers=False,
                         find_unused_parameters=False)
