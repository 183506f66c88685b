# Weighted k-NN (paper appendix: cosine similarity, T = 0.07, k in {10, 20, 100, 200}) of the
# 96-wide tiny ViT of configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py: the 2,000 test
# images of the rendered animal shapes voted on by the 8,000 training images
# (data/animal_shapes/objects/{train,test}/<class>/*.png), written by
#   python projects/mst_research/tools/write_animal_shapes.py data/animal_shapes
# For your own folder with train/<class>/ and test/<class>/ images, set data_root below.
# The 48-wide evidence ViT (mst_vit-tiny-p4_1xb64-coslr-6e_animals.py) has its own config,
# knn_vit-tiny-48_animals.py.
#   python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_vit-tiny_demo.py CKPT
_base_ = ['../../_base_/default_runtime.py']

data_root = 'data/animal_shapes/objects'
embed_dims = 96
model = dict(
    type='FeatureEmbedder',
    weights='teacher',
    data_preprocessor=dict(mean=[127.5] * 3, std=[64.0] * 3, to_rgb=True),
    backbone=dict(
        type='VisionTransformer',
        arch=dict(embed_dims=embed_dims, num_layers=4, num_heads=4,
                  feedforward_channels=embed_dims * 4),
        img_size=32, patch_size=4, out_type='cls_token'))

pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
reference_dataloader = dict(
    batch_size=256, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CustomDataset', data_root=data_root + '/train', pipeline=pipeline))
test_dataloader = dict(
    batch_size=256, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CustomDataset', data_root=data_root + '/test', pipeline=pipeline))
test_cfg = dict(type='KNNTestLoop', train_dataloader=reference_dataloader)
test_evaluator = dict(type='WeightedKNNAccuracy', ks=(10, 20, 100, 200), temperature=0.07)
