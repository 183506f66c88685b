"""Code of the evidence run (tools/evidence.py) and its tests: data writers, guidance shares,
frozen features and transfer fine-tuning. ``import mst_mm`` never imports this package."""
