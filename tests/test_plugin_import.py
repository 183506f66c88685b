"""``import mst_mm`` registers our names and changes nothing else, checked in a fresh
process that first loads every module of mmpretrain, mmdet and mmseg."""
import json
import subprocess
import sys

from tests.helpers import REPO

SNAPSHOT = r'''
import json, sys
from mmengine.registry import Registry
import mmengine.registry as root
from mmengine.runner import CheckpointLoader
import torch.serialization
from mmpretrain.utils import register_all_modules as pretrain_all
from mmdet.utils import register_all_modules as det_all
from mmseg.utils import register_all_modules as seg_all
pretrain_all(False); det_all(False); seg_all(False)

def registries():
    todo = [r for r in vars(root).values() if isinstance(r, Registry)]
    seen = {}
    while todo:
        registry = todo.pop()
        if id(registry) not in seen:
            seen[id(registry)] = registry
            todo.extend(registry.children.values())
    return seen.values()

def snapshot():
    entries = {f'{r.scope}/{r.name}/{key}': id(obj)
               for r in registries() for key, obj in r._module_dict.items()}
    schemes = {prefix: id(loader) for prefix, loader in CheckpointLoader._schemes.items()}
    return entries, schemes, len(torch.serialization.get_safe_globals())

before = snapshot()
import mst_mm  # noqa: F401
after = snapshot()
json.dump(dict(before=before, after=after), sys.stdout)
'''


def test_import_changes_no_entry_loader_or_initialiser_of_other_libraries():
    result = subprocess.run([sys.executable, '-c', SNAPSHOT], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    (entries, schemes, safe_globals), (new_entries, new_schemes, new_safe_globals) = (
        out['before'], out['after'])
    assert len(entries) > 1000  # mmpretrain, mmdet and mmseg were all loaded
    changed = {key for key, obj in entries.items() if new_entries.get(key) != obj}
    assert not changed, sorted(changed)[:10]
    assert new_schemes == schemes                 # mmengine's checkpoint loaders
    assert new_safe_globals == safe_globals       # torch's weights-only allow-list
    for key in entries:
        if key.endswith('/weight initializer/Pretrained'):
            assert new_entries[key] == entries[key]
    added = set(new_entries) - set(entries)
    assert {'mmpretrain/model/MST', 'mmengine/weight initializer/CheckedPretrained'} <= added
    # No name of ours is also a name of the same registry in another library.
    names = {}
    for key in entries:
        scope, registry, name = key.split('/', 2)
        names.setdefault((registry, name), set()).add(scope)
    clashes = [key for key in added if tuple(key.split('/', 2)[1:]) in names]
    assert not clashes, clashes
