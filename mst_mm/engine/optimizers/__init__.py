from .dino_optim_wrapper import AMP_OPTIM_WRAPPERS, DINOAmpOptimWrapper, DINOOptimWrapper

__all__ = ['AMP_OPTIM_WRAPPERS', 'DINOAmpOptimWrapper', 'DINOOptimWrapper']
