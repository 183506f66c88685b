# The evidence recipe (tools/run_evidence.sh, Quick-start command 1): the full MST recipe on a
# tiny ViT, pretrained on 8,000 rendered animal silhouettes (32 x 32, one animal per image on
# low-pass grey noise; mst_mm/datasets/animal_shapes.py), through the ImageNet configs' data
# path (PretrainImageFolder, LoadImageOrSkip, MultiCrop). Write the images first with
#   python tools/misc/write_animal_shapes.py data/animal_shapes
_base_ = ['mst_vit-tiny-p4_1xb64-coslr-10e_demo.py']

data_root = 'data/animal_shapes/objects'
max_epochs = 8
warmup_epochs = 1

train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='PretrainImageFolder',
        data_root=data_root,
        data_layout='imagenet',  # <data_root>/train/<class>/*.png; labels are not used
        pipeline={{_base_.train_dataloader.dataset.pipeline}}))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=warmup_epochs,
         end=max_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min_ratio=10.0,
         by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs)
default_hooks = dict(
    checkpoint=dict(interval=1, max_keep_ckpts=max_epochs),
    collapse_monitor=dict(window=100))   # 125 iterations per epoch
