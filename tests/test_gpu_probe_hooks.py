"""tests/cuda_probe_hooks.py on the CPU: the DeviceProbeHook that tests/test_cuda.py reads
after a GPU run, run here through tools/train.py exactly as there (``custom_imports`` names
the hooks module, ``custom_hooks`` adds the hook), so that a hook that breaks is seen in
every CI run and not first on a GPU node."""
import json
import math

import torch

from tests.helpers import REPO, load_tool, make_image_folder

EVIDENCE_CONFIG = REPO / 'configs' / 'mst' / 'mst_vit-tiny-p4_1xb64-coslr-6e_animals.py'
# The evidence recipe (the GPU check's learning run) on 8 images of 32 x 32 in batches of
# 4: two iterations, no data workers, no k-NN probe.
RUN_OVERRIDES = """
custom_imports = dict(imports=['mst_mm', 'tests.cuda_probe_hooks'], allow_failed_imports=False)
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root={data_root!r}))
train_cfg = dict(max_epochs=1)
custom_hooks = [dict(type='TeacherTempWarmupHook', start=0.015, end=0.015, warmup_epochs=0),
                dict(type='DeviceProbeHook')]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
log_level = 'WARNING'
"""


def test_device_probe_hook_records_a_train_py_run_on_the_cpu(tmp_path):
    from mst_mm.models.heads import dino_head
    all_reduce = dino_head.all_reduce
    data_root = tmp_path / 'data'
    make_image_folder(data_root / 'train', classes=2, per_class=4, size=(32, 32))
    config = tmp_path / 'run.py'
    config.write_text(f'_base_ = [{str(EVIDENCE_CONFIG)!r}]\n'
                      + RUN_OVERRIDES.format(data_root=str(data_root)))
    work_dir = tmp_path / 'work'
    load_tool('tools/train.py').main([str(config), '--work-dir', str(work_dir)])

    probe = json.loads((work_dir / 'device_probe_rank0.json').read_text())
    assert len(probe['iters']) == 2
    for it in probe['iters']:
        assert it['losses'] and all(math.isfinite(v) for v in it['losses'].values()), it
        assert it['student_moved'] and it['optim_wrapper'] == 'DINOOptimWrapper'
        # The evidence recipe's mask is attention-guided: computed from the teacher's CLS
        # attention (the teacher runs without patch features, so there is no feat_map).
        assert it['mask'] == dict(device='cpu', dtype='torch.bool', source='attn',
                                  source_device='cpu')
        assert 'scaler' not in it   # no AMP here
    assert probe['param_devices'] == probe['buffer_devices'] == ['cpu']
    assert probe['teacher_devices'] == ['cpu'] and probe['center_device'] == 'cpu'
    assert probe['linear_dtypes'] == ['torch.float32'] and probe['wrapper'] == 'MST'
    assert probe['teacher_moved'] > probe['teacher_tensors'] // 2, probe['teacher_moved']
    assert any(probe['center'])
    # The global crops' pass updates the neck's BN statistics, the local crops' pass not.
    assert [c['update_bn_stats'] for c in probe['neck_calls']] == [True, False] * 2
    assert all(c['stats_changed'] == c['update_bn_stats'] for c in probe['neck_calls'])
    assert [r['device'] for r in probe['center_reduces']] == ['cpu', 'cpu']
    # The hook's spy on the module-level all_reduce is gone after the run.
    assert dino_head.all_reduce is all_reduce


def test_device_probe_hook_records_the_cls_feature_when_there_is_no_attention():
    """With a random mask (or none) the teacher gives no attention; MST sizes the mask's
    zeros from the CLS feature, and the hook records that one's device."""
    from tests.cuda_probe_hooks import DeviceProbeHook

    class Model:
        def _mask(self, feats):
            return torch.zeros(feats.global_feat.shape[0], 4, dtype=torch.bool)

    class Feats:
        attn, feat_map, global_feat = None, None, torch.zeros(2, 8)

    hook, model = DeviceProbeHook(), Model()
    hook._spy_mask(model)
    assert model._mask(Feats()).shape == (2, 4)
    assert hook.mask == dict(device='cpu', dtype='torch.bool', source='global_feat',
                             source_device='cpu')
