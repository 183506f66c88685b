from .distributed import CPUSyncBatchNorm, DeviceAgnosticDDP, init_cpu_distributed
from .hooks import *  # noqa: F401,F403
from .knn_loop import KNNTestLoop
from .optimizers import AMP_OPTIM_WRAPPERS, DINOAmpOptimWrapper, DINOOptimWrapper
from .safe_loading import (
    allow_mmengine_checkpoint_globals,
    install_weights_only_loader,
    load_local_checkpoint,
)

allow_mmengine_checkpoint_globals()
install_weights_only_loader()

__all__ = [
    'AMP_OPTIM_WRAPPERS', 'CPUSyncBatchNorm', 'DINOAmpOptimWrapper', 'DINOOptimWrapper',
    'DeviceAgnosticDDP', 'KNNTestLoop', 'allow_mmengine_checkpoint_globals',
    'init_cpu_distributed', 'install_weights_only_loader', 'load_local_checkpoint'
]
