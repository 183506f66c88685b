from .dino_schedule_hooks import FreezeLastLayerHook, TeacherTempWarmupHook
from .mst_visualization_hook import MSTVisualizationHook

__all__ = ['FreezeLastLayerHook', 'MSTVisualizationHook', 'TeacherTempWarmupHook']
