from .collapse_monitor_hook import CollapseMonitorHook, collapse_mode
from .dino_schedule_hooks import FreezeLastLayerHook, TeacherTempWarmupHook
from .knn_probe_hook import KNNProbeHook
from .mst_visualization_hook import MSTVisualizationHook
from .random_state_hook import RandomStateHook
from .safe_checkpoint_hook import SafeCheckpointHook
from .schedule_logger_hook import ScheduleLoggerHook

__all__ = ['CollapseMonitorHook', 'FreezeLastLayerHook', 'KNNProbeHook', 'MSTVisualizationHook',
           'RandomStateHook', 'SafeCheckpointHook', 'ScheduleLoggerHook', 'TeacherTempWarmupHook',
           'collapse_mode']
