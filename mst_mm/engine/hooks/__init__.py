from .dino_schedule_hooks import FreezeLastLayerHook, TeacherTempWarmupHook
from .mst_visualization_hook import MSTVisualizationHook
from .random_state_hook import RandomStateHook
from .safe_checkpoint_hook import SafeCheckpointHook

__all__ = ['FreezeLastLayerHook', 'MSTVisualizationHook', 'RandomStateHook',
           'SafeCheckpointHook', 'TeacherTempWarmupHook']
