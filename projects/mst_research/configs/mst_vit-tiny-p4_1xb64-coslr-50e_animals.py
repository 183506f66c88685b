# The long evidence recipe (issue 38): the 6-epoch animals recipe run for 50 epochs (400,000
# image-views), with the teacher of DINO's recipe kept closer: momentum 0.996 -> 1 instead of
# 0.99 -> 1, and a teacher temperature of 0.02 instead of 0.015. Chosen on DINO's held-out
# seeds 10 and 11 on the validation split carved from the training images (projects/mst_research/tools/evidence.py
# --validation); the candidates and their curves are in docs/evidence.md.
_base_ = ['../../../configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py']

data_root = 'data/animal_shapes/objects'
max_epochs = 50
warmup_epochs = 8         # the 6-epoch recipe's first sixth
teacher_temp = 0.02       # 0.025: a softer teacher, 1 point lower; 0.04 stayed near uniform
model = dict(base_momentum=0.004)   # DINO's 0.996: at 50 epochs the average spans ~2 epochs

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=warmup_epochs,
         end=max_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min_ratio=10.0,
         by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs)

probe_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
custom_hooks = [
    dict(type='TeacherTempWarmupHook', start=teacher_temp, end=teacher_temp, warmup_epochs=0),
    dict(type='FreezeLastLayerHook', freeze_epochs=1),
    # Every second epoch: 26 points of the curve, 4 s each.
    dict(type='KNNProbeHook', interval=2, ks=(20, ),
         reference_dataloader=dict(batch_size=500, dataset=dict(
             type='CustomDataset', data_root=data_root + '/train', pipeline=probe_pipeline)),
         query_dataloader=dict(batch_size=500, dataset=dict(
             type='CustomDataset', data_root=data_root + '/test', pipeline=probe_pipeline))),
]
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=max_epochs))
