# Weighted k-NN of an MST Swin-T checkpoint on ImageNet-1k (paper Table 1, Swin-T k-NN):
# the teacher's last stage, normed and average-pooled over its 7 x 7 map. That is the
# feature MST pretrains (MaskSwin's global feature, fed to the DINO head) and the one Swin's
# own classifier pools; Swin has no CLS token. Otherwise as knn_deit-s_in1k.py.
#   python tools/analysis/knn_eval.py configs/benchmarks/knn/knn_swin-t_in1k.py CKPT
_base_ = ['knn_deit-s_in1k.py']

model = dict(
    backbone=dict(_delete_=True, type='SwinTransformer', arch='tiny', img_size=224,
                  out_indices=(3, ),
                  # As in pretraining (mst_swin-t.py): the last stage's 7 x 7 map equals the
                  # window, where mmpretrain's default drops the shift and this keeps it.
                  pad_small_map=True),
    neck=dict(type='GlobalAveragePooling'))
