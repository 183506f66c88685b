from .checked_loading import (
    CheckedPretrainedInit,
    CheckedRunner,
    build_runner,
    load_state_dict_checked,
    raise_if_incomplete,
)
from .cli import (
    add_cfg_options_argument,
    check_cfg_options,
    merge_cfg_options,
    run_tool,
)
from .distributed import CPUSyncBatchNorm, DeviceAgnosticDDP, init_cpu_distributed
from .errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigOptionError,
    ConfigValueError,
    IncompleteCheckpointError,
    NotATestConfigError,
    NotATrainingCheckpointError,
    UnreadableCheckpointError,
    UnsafeCheckpointError,
    UserInputError,
)
from .hooks import *  # noqa: F401,F403
from .knn_loop import KNNTestLoop
from .loops import MidEpochResumeTrainLoop
from .optim_constructor import StudentOptimWrapperConstructor
from .optimizers import AMP_OPTIM_WRAPPERS, DINOAmpOptimWrapper, DINOOptimWrapper
from .resume import check_training_checkpoint, find_resume_checkpoint, read_last_checkpoint
from .safe_loading import (
    install_weights_only_loader,
    load_checkpoint_safely,
    load_local_checkpoint,
    read_checkpoint,
)

__all__ = [
    'AMP_OPTIM_WRAPPERS', 'CPUSyncBatchNorm', 'CheckedPretrainedInit',
    'CheckedRunner', 'CheckpointError', 'CheckpointNotFoundError', 'ConfigOptionError',
    'ConfigValueError', 'DINOAmpOptimWrapper', 'DINOOptimWrapper', 'DeviceAgnosticDDP',
    'IncompleteCheckpointError', 'KNNTestLoop', 'MidEpochResumeTrainLoop',
    'NotATestConfigError', 'NotATrainingCheckpointError', 'StudentOptimWrapperConstructor',
    'UnreadableCheckpointError', 'UnsafeCheckpointError', 'UserInputError',
    'add_cfg_options_argument', 'build_runner',
    'check_cfg_options', 'check_training_checkpoint', 'find_resume_checkpoint',
    'init_cpu_distributed', 'install_weights_only_loader', 'load_checkpoint_safely',
    'load_local_checkpoint', 'load_state_dict_checked', 'merge_cfg_options',
    'raise_if_incomplete', 'read_checkpoint', 'read_last_checkpoint', 'run_tool'
]
