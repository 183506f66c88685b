# The 300-epoch optimisation on a 100-epoch schedule (the paper's ablations and Swin-T):
# the same warm-up, then the cosine learning-rate and weight-decay schedules end at 100.
_base_ = ['mst_adamw_300e.py']

max_epochs = 100
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=10, end=max_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min_ratio=10.0,
         by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs)
