# Linear probing (paper appendix): SGD, batch 1024, no weight decay, 100 epochs, cosine.
# The paper reports lr 0.00024 at batch 1024; DINO sweeps lr per model, so override it with
# --cfg-options optim_wrapper.optimizer.lr=... when reproducing other numbers.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.00024, momentum=0.9, weight_decay=0.0))
param_scheduler = [dict(type='CosineAnnealingLR', T_max=100, by_epoch=True, begin=0, end=100)]
train_cfg = dict(by_epoch=True, max_epochs=100, val_interval=10)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=1024)
