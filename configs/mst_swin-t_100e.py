# Moved to configs/mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py
# (OpenMMLab naming). This alias keeps the old name working for now; use the new path.
_base_ = ['./mst/mst_swin-t-p4-w7_8xb128-coslr-100e_in1k.py']
