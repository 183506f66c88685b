from .dino_schedule_hooks import FreezeLastLayerHook, TeacherTempWarmupHook

__all__ = ['FreezeLastLayerHook', 'TeacherTempWarmupHook']
