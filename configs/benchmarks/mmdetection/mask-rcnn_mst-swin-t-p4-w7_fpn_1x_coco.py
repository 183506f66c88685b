# Mask R-CNN, Swin-T FPN, 1x schedule on COCO (paper Table 2), from an MST checkpoint.
# mmdet's stock config unchanged but for the pretrained weights: it already trains with
# AdamW (lr 1e-4, weight decay 0.05, 8 GPUs x 2 images), as the paper does.
#
#   python tools/model_converters/mst2downstream.py \
#       work_dirs/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k/epoch_100.pth pretrain/mst_swin-t_mmdet.pth --target mmdet
#   tools/dist_train.sh configs/benchmarks/mmdetection/mask-rcnn_mst-swin-t-p4-w7_fpn_1x_coco.py 8
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

# mst_mm makes every checkpoint load weights-only (mst_mm.engine.safe_loading).
custom_imports = dict(imports=['mst_mm'], allow_failed_imports=False)

pretrained = 'pretrain/mst_swin-t_mmdet.pth'
model = dict(
    backbone=dict(
        # The converter writes mmdet's own key names: the stock `convert_weights=True`
        # expects the original Swin repository's names and would rename ours wrongly.
        convert_weights=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
