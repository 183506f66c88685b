from .distributed import CPUSyncBatchNorm, DeviceAgnosticDDP, init_cpu_distributed
from .hooks import *  # noqa: F401,F403
from .knn_loop import KNNTestLoop
from .safe_loading import allow_mmengine_checkpoint_globals

allow_mmengine_checkpoint_globals()

__all__ = [
    'CPUSyncBatchNorm', 'DeviceAgnosticDDP', 'KNNTestLoop', 'allow_mmengine_checkpoint_globals',
    'init_cpu_distributed'
]
