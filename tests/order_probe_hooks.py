"""A hook for tests/test_resume.py that records which images every iteration trained on."""
import json
import os.path as osp

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class BatchOrderProbeHook(Hook):
    """Appends ``{"iter": i, "samples": [...]}`` per iteration to WORK_DIR/batch_order.jsonl."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        samples = [sample.metainfo.get('img_path') for sample in data_batch['data_samples']]
        with open(osp.join(runner.work_dir, 'batch_order.jsonl'), 'a') as f:
            f.write(json.dumps(dict(iter=runner.iter + 1, batch_idx=batch_idx,
                                    samples=samples)) + '\n')
