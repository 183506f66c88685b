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
    # Kept: epoch_N.pth every 10 epochs, the last 3; at the other epoch ends latest.pth,
    # which --resume alone picks up (last_checkpoint), so a pre-emption costs at most one epoch.
    checkpoint=dict(type='SafeCheckpointHook', interval=10, max_keep_ckpts=3),
    # The saving process's RNG states in each checkpoint, restored on resume: a run on one
    # process resumes bit for bit (see docs/reliability.md for more ranks and workers).
    random_state=dict(type='RandomStateHook'),
    # Warns when the DINO loss sits in uniform or one-hot collapse (teacher entropy and
    # teacher-student KL, logged every iteration); never stops a run.
    collapse_monitor=dict(type='CollapseMonitorHook', window=1000),
    # Logs the scheduled weight decay (`wd`, as DINO) and the EMA teacher's momentum.
    schedule_logger=dict(type='ScheduleLoggerHook'),
)
log_processor = dict(window_size=50)

# A random stream per rank (crops, masks, drop-path): mmengine seeds rank r with seed + r
# (seed=None: one drawn at start). Workers get mmengine's stock seeding (Runner.build_dataloader
# passes the runner's seed to its worker_init_fn: seed + num_workers * rank + worker_id), once
# per run with persistent workers, so their streams go on from epoch to epoch.
randomness = dict(seed=None, diff_rank_seed=True)

# Fixed crop sizes (224 and 96 px): cuDNN's autotuning of the patch embedding and the
# decoder's convolutions runs once per size.
env_cfg = dict(cudnn_benchmark=True)

# DDP (mmengine's default MMDistributedDataParallel): BN layers of neck and decoder become
# SyncBN, all of them, as the paper's appendix "BatchNorm" sets (the decoder's BN trains as
# the head's). Every parameter takes part in every backward (the
# frozen last layer too: its gradient is cancelled in the optimiser wrapper, as DINO does),
# so DDP needs no search for unused parameters (find_unused_parameters=False, the default).
sync_bn = 'torch'
