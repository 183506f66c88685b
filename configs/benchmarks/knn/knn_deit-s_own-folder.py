# Weighted k-NN of an MST DeiT-S checkpoint on your own labelled images (docs/own_data.md,
# "Evaluate on your own labelled folder"): the settings of knn_deit-s_in1k.py (teacher's CLS
# token, 256 px short edge, 224 px centre crop, T = 0.07) on two folders of class folders.
# What to change, nothing else:
#   data_root (here the placeholder data/my_dataset): a folder holding train/<class>/<images> (the reference set, labelled by its
#     folder names) and val/<class>/<images> (the queries), with the same class folders in
#     both (a label is the index of its folder name in the sorted list, per split).
# Edit data_root below, or give the two folders on the command line:
#   python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_deit-s_own-folder.py CKPT \
#       --cfg-options test_cfg.train_dataloader.dataset.data_root=/data/pets/train \
#                     test_dataloader.dataset.data_root=/data/pets/val
_base_ = ['knn_deit-s_in1k.py']

data_root = 'data/my_dataset'  # train/ and val/ class folders; not shipped: name yours

pipeline = {{_base_.pipeline}}
# CheckedImageDataset: mmpretrain's CustomDataset (class folders) with errors that name the
# missing folder or the layout it expects.
reference_dataloader = dict(
    dataset=dict(_delete_=True, type='CheckedImageDataset', data_root=data_root + '/train',
                 pipeline=pipeline))
test_dataloader = dict(
    dataset=dict(_delete_=True, type='CheckedImageDataset', data_root=data_root + '/val',
                 pipeline=pipeline))
test_cfg = dict(type='KNNTestLoop', train_dataloader=reference_dataloader)
