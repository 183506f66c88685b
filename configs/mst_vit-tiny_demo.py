# Moved to configs/mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py
# (OpenMMLab naming). This alias keeps the old name working for now; use the new path.
_base_ = ['./mst/mst_vit-tiny-p4_1xb64-coslr-10e_demo.py']
