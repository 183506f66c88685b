# MST, DeiT-S/16, 100 epochs, with DINO's own projection head: no BatchNorm, the last
# layer's magnitudes held fixed (DINO's default `--norm_last_layer true`) and K = 65,536.
# That is the layout of the heads in DINO's full checkpoints, so
# tools/model_converters/dino2mst.py carries a DINO head and its centre over into this
# config (into the recipe's BN neck only the backbone goes). DINO's ViT-S/16 release trained
# its magnitudes (`--norm_last_layer false`): they are carried as they are and, here, stay
# fixed; `--cfg-options model.neck.norm_last_layer=False` trains them on (pass it to both
# dino2mst.py and tools/train.py). docs/own_data.md, "Start from DINO's weights".
_base_ = ['mst_deit-s-p16_8xb128-coslr-100e_in1k.py']
model = dict(neck=dict(with_bn=False, norm_last_layer=True))
