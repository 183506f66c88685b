# DINO's linear-probe protocol (paper Table 8, marked with a dagger): the CLS tokens of the
# last 4 blocks, each final-normed, concatenated (4 x 384); for ViT-S DINO does not add the
# averaged patch tokens (model.neck.avgpool_patch_tokens=True with head.in_channels=1920
# adds them, as DINO does for ViT-B).
_base_ = ['linear_deit-s_cls-last_8xb128-100e_in1k.py']
model = dict(
    backbone=dict(out_type='raw', out_indices=[8, 9, 10, 11], norm_intermediate=True),
    neck=dict(type='MultiBlockCLSNeck', avgpool_patch_tokens=False),
    head=dict(in_channels=4 * 384))
