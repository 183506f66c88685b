# Weighted k-NN (cosine similarity, T = 0.07, k in {10, 20, 100, 200}) of the evidence ViT:
# configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py and the research kit's -50e_animals.py
# (48 channels, 4 layers, 3 heads, 4-px patches, 32-px images; the EMA teacher by default).
# The 2,000 test images of the rendered animal shapes are voted on by the 8,000 training images
# (data/animal_shapes/objects/{train,test}/<class>/*.png), as the evidence run's k-NN probe
# does (it reports k = 20). Write the images first with
#   python projects/mst_research/tools/write_animal_shapes.py data/animal_shapes
# then, e.g. for Quick-start command 1's checkpoint:
#   python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_vit-tiny-48_animals.py \
#       work_dirs/mst_demo/pretrain/mst_guided_mask_seed0/epoch_6.pth
_base_ = ['knn_vit-tiny_demo.py']

data_root = 'data/animal_shapes/objects'
embed_dims = 48
model = dict(
    backbone=dict(arch=dict(embed_dims=embed_dims, num_layers=4, num_heads=3,
                            feedforward_channels=embed_dims * 4)))
test_dataloader = dict(dataset=dict(data_root=data_root + '/test'))
test_cfg = dict(train_dataloader=dict(dataset=dict(data_root=data_root + '/train')))
