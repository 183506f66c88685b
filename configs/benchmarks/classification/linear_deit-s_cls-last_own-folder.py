# Linear probe on the last layer's CLS token of a frozen MST DeiT-S, on your own labelled
# images (docs/own_data.md, "Evaluate on your own labelled folder"): the recipe of
# linear_deit-s_cls-last_8xb128-100e_in1k.py on two folders of class folders.
# What to change, nothing else:
#   data_root (here the placeholder data/my_dataset): a folder holding train/<class>/<images> (trains the linear layer) and
#     val/<class>/<images> (its accuracy after every val_interval epochs), with the same class
#     folders in both (a label is the index of its folder name in the sorted list, per split);
#   num_classes: the number of class folders in train/ (the linear layer's outputs);
#   checkpoint: the MST checkpoint whose teacher is probed.
# Edit them below, or give them on the command line:
#   python tools/train.py configs/benchmarks/classification/linear_deit-s_cls-last_own-folder.py \
#       --cfg-options model.backbone.init_cfg.checkpoint=CKPT model.head.num_classes=37 \
#                     train_dataloader.dataset.data_root=/data/pets/train \
#                     val_dataloader.dataset.data_root=/data/pets/val \
#                     test_dataloader.dataset.data_root=/data/pets/val
# Top-1 only: top-5 needs 5 classes or more (add val_evaluator.topk="(1,5)" then).
_base_ = ['linear_deit-s_cls-last_8xb128-100e_in1k.py']

data_root = 'data/my_dataset'  # train/ and val/ class folders; not shipped: name yours
num_classes = 10               # the number of class folders in train/

model = dict(head=dict(num_classes=num_classes))
data_preprocessor = dict(num_classes=num_classes)
# CheckedImageDataset: mmpretrain's CustomDataset (class folders) with errors that name the
# missing folder or the layout it expects.
train_dataloader = dict(dataset=dict(_delete_=True, type='CheckedImageDataset',
                                     data_root=data_root + '/train',
                                     pipeline={{_base_.train_pipeline}}))
val_dataloader = dict(dataset=dict(_delete_=True, type='CheckedImageDataset',
                                   data_root=data_root + '/val',
                                   pipeline={{_base_.test_pipeline}}))
test_dataloader = val_dataloader
val_evaluator = dict(topk=(1, ))
test_evaluator = val_evaluator
