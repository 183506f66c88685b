"""``import mst_mm``, and then one checkpoint load by each of our load paths, change nothing of
other libraries: torch's weights-only allow-list, mmengine's checkpoint loaders, and every
registry entry of mmengine, mmpretrain, mmdet and mmseg. Checked in a fresh process that
first registers every module of mmpretrain, mmdet and mmseg."""
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPT = r'''
import json, os, sys, tempfile
import numpy as np
import torch
import mmengine.registry as root
from mmengine.registry import Registry
from mmengine.runner import CheckpointLoader
from mmpretrain.utils import register_all_modules as pretrain_all
from mmdet.utils import register_all_modules as det_all
from mmseg.utils import register_all_modules as seg_all
pretrain_all(False); det_all(False); seg_all(False)


def registries():
    todo, seen = [r for r in vars(root).values() if isinstance(r, Registry)], {}
    while todo:
        registry = todo.pop()
        if id(registry) not in seen:
            seen[id(registry)] = registry
            todo.extend(registry.children.values())
    return seen.values()


def snapshot():
    return dict(
        entries={f'{r.scope}/{r.name}/{key}': id(obj)
                 for r in registries() for key, obj in r._module_dict.items()},
        schemes={prefix: id(loader) for prefix, loader in CheckpointLoader._schemes.items()},
        safe_globals=sorted(map(str, torch.serialization.get_safe_globals())))


snapshots = [snapshot()]
import mst_mm  # noqa: F401
snapshots.append(snapshot())

from mmengine.logging import MessageHub
from mmpretrain.models import VisionTransformer
from mst_mm.engine import CheckedPretrainedInit, CheckedRunner, read_checkpoint

# An mmengine training checkpoint: numpy values and a message hub of HistoryBuffers.
work = tempfile.mkdtemp()
vit = dict(arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64),
           img_size=32, patch_size=8)
weights = VisionTransformer(**vit).state_dict()
hub = MessageHub.get_instance('plugin_import')
hub.update_scalar('train/loss', np.float64(1.0))
checkpoint = os.path.join(work, 'epoch_1.pth')
torch.save(dict(meta=dict(epoch=1, iter=2, seed=np.int64(0)), message_hub=hub.state_dict(),
                state_dict={**{'backbone.' + k: v for k, v in weights.items()},
                            **{'teacher.module.0.' + k: v for k, v in weights.items()}}),
           checkpoint)
assert read_checkpoint(checkpoint)['message_hub']['log_scalars']['train/loss'].mean() == 1.0
CheckedPretrainedInit(checkpoint, prefix='teacher.module.0.')(VisionTransformer(**vit))
runner = CheckedRunner(
    model=dict(type='FeatureEmbedder',
               backbone=dict(type='VisionTransformer', out_type='cls_token', **vit)),
    work_dir=os.path.join(work, 'run'), default_scope='mmpretrain')
runner.load_checkpoint(checkpoint)
sys.path.insert(0, 'tools/model_converters')
import mst2downstream
mst2downstream.main([checkpoint, os.path.join(work, 'backbone.pth'), '--target', 'mmpretrain'])
snapshots.append(snapshot())
print('\n' + json.dumps(snapshots))
'''


@pytest.mark.slow
def test_import_and_our_loads_change_nothing_of_other_libraries():
    result = subprocess.run([sys.executable, '-c', SCRIPT], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    before, imported, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(before['entries']) > 1000  # mmpretrain, mmdet and mmseg were all loaded
    for after in (imported, loaded):
        changed = {key for key, obj in before['entries'].items()
                   if after['entries'].get(key) != obj}
        assert not changed, sorted(changed)[:10]
        assert after['schemes'] == before['schemes']             # mmengine's loaders
        assert after['safe_globals'] == before['safe_globals']   # torch's allow-list
    added = set(imported['entries']) - set(before['entries'])
    assert {'mmpretrain/model/MST', 'mmengine/weight initializer/CheckedPretrained'} <= added
    # No name of ours is also a name of the same registry in another library.
    names = {tuple(key.split('/', 2)[1:]) for key in before['entries']}
    clashes = [key for key in added if tuple(key.split('/', 2)[1:]) in names]
    assert not clashes, clashes
