from .distributed import CPUSyncBatchNorm, DeviceAgnosticDDP, init_cpu_distributed
from .hooks import *  # noqa: F401,F403

__all__ = ['CPUSyncBatchNorm', 'DeviceAgnosticDDP', 'init_cpu_distributed']
