# The pretraining data with MST's multi-crop: ImageNet-1k's train split by default, or any
# folder of your own images by changing only data_root (docs/own_data.md):
#   --cfg-options train_dataloader.dataset.data_root=/path/to/images
# PretrainImageFolder finds the layout (data_layout='auto'): a flat folder of images (any
# depth), a folder of class sub-folders, or ImageNet's (<root>/train/ with class folders
# or meta/train.txt). Labels are not needed. Force one with dataset.data_layout='flat',
# 'class_folders' or 'imagenet'.
# Crop scales and counts follow DINO's main_dino.py defaults for ViT-S/16:
# 2 global crops of 224 px, scale (0.4, 1.0); 8 local crops of 96 px, scale (0.05, 0.4).
# The image is decoded once per sample, before MultiCrop. Broken images are skipped with a
# warning (LoadImageOrSkip), up to the dataset's max_corrupt_images; a missing data_root or
# missing listed images stop the run at start-up.
# The workers decode and cut and resize the ten crops (crops_only=True), the part that needs
# each image at its own size; the model's data preprocessor (MultiCropDataPreprocessor with
# BatchViewAugment, _base_/models/mst_deit-s.py) does the rest on the GPU, batched. A worker
# then spends a third of DINO's per-image time (docs/benchmarks.md), so 8 workers per GPU
# keep a step fed; tools/slurm_train.sh gives each GPU as many cores (CPUS_PER_TASK).
train_pipeline = [
    dict(type='LoadImageOrSkip'),
    dict(type='MultiCrop', global_size=224, local_size=96, num_local_crops=8,
         global_scale=(0.4, 1.0), local_scale=(0.05, 0.4), crops_only=True),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type='PretrainImageFolder',
        data_root='data/imagenet/',
        data_layout='auto',
        split='train',
        max_corrupt_images=100,
        pipeline=train_pipeline))
