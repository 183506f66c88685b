from .checked_runner import *  # noqa: F401,F403
from .distributed import init_cpu_distributed
from .hooks import *  # noqa: F401,F403
from .knn_loop import KNNTestLoop
from .optim_constructor import StudentOptimWrapperConstructor
from .optimizers import AMP_OPTIM_WRAPPERS, DINOAmpOptimWrapper, DINOOptimWrapper
from .safe_loading import *  # noqa: F401,F403

__all__ = ['AMP_OPTIM_WRAPPERS', 'DINOAmpOptimWrapper', 'DINOOptimWrapper', 'KNNTestLoop',
           'StudentOptimWrapperConstructor', 'init_cpu_distributed']
