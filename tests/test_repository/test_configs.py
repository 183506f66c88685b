"""Every config builds; the full DeiT-S recipe runs one real training step on CPU.

The pretraining configs live in configs/mst/ with OpenMMLab names, indexed by its metafile.yml
(read by `mim` through model-index.yml); the old short names are aliases of them.
"""

import ast
import importlib.util
import os
import os.path as osp
import re
from pathlib import Path

import pytest
import torch
import yaml
from mmengine.config import Config
from mmengine.dataset import default_collate
from mmengine.logging import MessageHub
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmpretrain.registry import DATASETS, MODELS

import mst_mm
from tests.helpers import REPO, make_image_folder

MST_DIR = REPO / 'configs' / 'mst'
SCHEDULE_100E = '8xb128-coslr-100e_in1k'
# {algorithm}_{backbone}_{gpus}x{batch}[-options]-{epochs}e_{dataset}, as mmpretrain names them
OPENMMLAB_NAME = re.compile(r'[a-z0-9-]+_[a-z0-9-]+_\d+xb\d+(-[a-z0-9]+)*-\d+e_[a-z0-9-]+')

# The mmdet / mmseg fine-tuning configs have their own scopes
# (tests/test_converters/test_downstream.py).
DOWNSTREAM = ('mmdetection', 'mmsegmentation')
PRETRAIN_CONFIGS = sorted(
    str(p.relative_to(REPO)) for p in (REPO / 'configs').rglob('*.py')
    if '_base_' not in p.parts and not set(DOWNSTREAM) & set(p.parts))


@pytest.mark.parametrize('config', PRETRAIN_CONFIGS)
def test_config_loads_and_names_registered_modules(config):
    cfg = Config.fromfile(str(REPO / config))
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.custom_imports.imports == ['mst_mm']
    assert MODELS.get(cfg.model.type) is not None


def test_ablations_change_only_what_they_say():
    base = Config.fromfile(str(MST_DIR / f'mst_deit-s-p16_{SCHEDULE_100E}.py'))
    ablations = MST_DIR / 'ablations'
    random = Config.fromfile(str(ablations / f'mst-mask-random_deit-s-p16_{SCHEDULE_100E}.py'))
    assert random.model.mask_cfg == dict(num=8, p=0.1, mode='random')
    dino = Config.fromfile(str(ablations / f'dino_deit-s-p16_{SCHEDULE_100E}.py'))
    assert dino.model.decoder_head is None and dino.model.mask_cfg.mode == 'none'
    assert dino.model.neck.with_bn is False   # DINO's head: no BN
    dino_bn = Config.fromfile(str(ablations / f'dino-neck-bn_deit-s-p16_{SCHEDULE_100E}.py'))
    assert dino_bn.model.neck == {**dino.model.neck, 'with_bn': True, 'bn_statistics': 'all_crops'}
    assert base.model.neck.bn_statistics == 'global_crops' and base.model.neck.with_bn
    no_bn = Config.fromfile(str(ablations / f'mst-neck-no-bn_deit-s-p16_{SCHEDULE_100E}.py'))
    assert no_bn.model.neck.with_bn is False
    assert random.optim_wrapper == base.optim_wrapper
    assert base.train_cfg.max_epochs == 100 and base.param_scheduler[1].end == 100
    swin = Config.fromfile(str(MST_DIR / f'mst_swin-t-p4-w7_{SCHEDULE_100E}.py'))
    similarity = Config.fromfile(
        str(ablations / f'mst-guidance-similarity_swin-t-p4-w7_{SCHEDULE_100E}.py'))
    assert swin.model.backbone.guidance == 'pooled_query'
    assert similarity.model.backbone == {**swin.model.backbone, 'guidance': 'pooled_similarity'}
    swin_random = Config.fromfile(
        str(ablations / f'mst-mask-random_swin-t-p4-w7_{SCHEDULE_100E}.py'))
    assert swin_random.model.mask_cfg.mode == 'random'
    assert swin_random.model.backbone == swin.model.backbone


def metafile_models() -> list:
    with open(MST_DIR / 'metafile.yml') as f:
        return yaml.safe_load(f)['Models']


def test_metafile_indexes_every_pretraining_config_by_its_openmmlab_name():
    models = metafile_models()
    listed = {m['Config'] for m in models}
    on_disk = {str(p.relative_to(REPO)) for p in MST_DIR.rglob('*.py')}
    assert listed == on_disk
    for model in models:
        path = Path(model['Config'])
        assert model['Name'] == path.stem and model['In Collection'] == 'MST'
        assert OPENMMLAB_NAME.fullmatch(path.stem), path.stem
        # the `{gpus}x{batch}` of the name is what the config trains with
        gpus, batch = map(int, re.search(r'_(\d+)xb(\d+)', path.stem).groups())
        cfg = Config.fromfile(str(REPO / path))
        assert cfg.train_dataloader.batch_size == batch
        assert model['Metadata']['Batch Size'] == gpus * batch
        assert model['Metadata']['Epochs'] == cfg.train_cfg.max_epochs
        assert f'-{cfg.train_cfg.max_epochs}e_' in path.stem
    with open(REPO / 'model-index.yml') as f:
        assert yaml.safe_load(f)['Import'] == ['configs/mst/metafile.yml']


def check_mim_finds_configs(package_dir: Path) -> None:
    """What `mim train mst_mm NAME.py` does (openmim 0.3.9): walk the installed package, following
    links, for a file of that name, and refuse a name that it finds twice."""
    mim = package_dir / '.mim'
    with open(mim / 'model-index.yml') as f:
        imported = yaml.safe_load(f)['Import']
    assert all((mim / path).is_file() for path in imported)
    assert (mim / 'tools' / 'train.py').is_file()
    # Only the user tools of mmpretrain's layout: the research kit's tools (evidence.py, the
    # benchmarks, check_gpu.py) and the environment scripts stay in the repository.
    tools = {osp.relpath(osp.join(d, f), mim / 'tools').split(os.sep)[0] if d != str(mim / 'tools')
             else f for d, _, files in os.walk(mim / 'tools', followlinks=True) for f in files}
    assert tools == {'train.py', 'test.py', 'dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
                     'slurm_test.sh', 'analysis', 'model_converters'}, tools
    analysis = sorted(os.listdir(mim / 'tools' / 'analysis'))
    assert analysis == ['browse_dataset.py', 'knn_eval.py', 'visualize_mst.py'], analysis
    for model in metafile_models():
        name = Path(model['Config']).name
        found = [Path(d) / name for d, _, files in os.walk(package_dir, followlinks=True)
                 if name in files]
        assert found == [mim / model['Config']], (name, found)


def test_mim_finds_every_config_by_file_name_in_the_installed_package():
    check_mim_finds_configs(Path(mst_mm.__file__).parent)


def test_mim_finds_every_config_by_file_name_in_a_built_package(tmp_path):
    spec = importlib.util.spec_from_file_location('mst_mm_setup', REPO / 'setup.py')
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    setup_py.add_mim_extension(str(tmp_path / '.mim'), mode='copy')   # as a wheel build does
    check_mim_finds_configs(tmp_path)
    with pytest.raises(ValueError, match="mode must be 'symlink' or 'copy'"):
        setup_py.add_mim_extension(str(tmp_path / '.mim'), mode='hardlink')


@pytest.mark.parametrize('name', [m['Name'] for m in metafile_models()])
def test_metafile_configs_build(name):
    config = next(m['Config'] for m in metafile_models() if m['Name'] == name)
    cfg = Config.fromfile(str(REPO / config))
    model = MODELS.build(cfg.model)
    assert type(model).__name__ == cfg.model.type == 'MST'
    assert type(model.backbone).__name__ == cfg.model.backbone.type
    assert model.head.center.shape == (1, cfg.model.head.out_channels)
    assert (model.decoder_head is None) == (cfg.model.decoder_head is None)


def test_configs_hold_the_openmmlab_tree_and_the_one_short_name():
    top = sorted(p.name for p in (REPO / 'configs').iterdir())
    assert top == ['_base_', 'benchmarks', 'mst', 'mst_deit-s_300e.py']


@pytest.mark.parametrize('alias', ['configs/mst_deit-s_300e.py'])
def test_the_short_name_is_an_alias_of_the_recipe(alias):
    statements = ast.parse((REPO / alias).read_text()).body
    assert [t.id for s in statements for t in s.targets] == ['_base_']   # nothing but the base
    base, = ast.literal_eval(statements[0].value)
    target = (REPO / alias).parent / base
    cfg = Config.fromfile(str(REPO / alias))
    assert MST_DIR in target.resolve().parents, base
    moved = Config.fromfile(str(target))
    assert cfg.to_dict() == moved.to_dict()
    assert 'configs/mst/' in (REPO / alias).read_text()  # names the recipe it stands for


@pytest.mark.parametrize('config, backbone_params', [
    ('configs/mst/mst_deit-s-p16_8xb128-coslr-300e_in1k.py', 21.7e6),
    (f'configs/mst/mst_swin-t-p4-w7_{SCHEDULE_100E}.py', 27.5e6)])
@pytest.mark.slow
def test_full_recipe_runs_one_step_at_batch_two(config, backbone_params, tmp_path):
    cfg = Config.fromfile(str(REPO / config))
    assert cfg.train_dataloader.batch_size * 8 == 1024
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    assert sum(p.numel() for p in model.backbone.parameters()) == pytest.approx(backbone_params,
                                                                                rel=0.01)

    data_root = make_image_folder(tmp_path / 'data', classes=1, per_class=2, size=(256, 320))
    dataset_cfg = dict(type='CustomDataset', data_root=data_root,
                       pipeline=cfg.train_dataloader.dataset.pipeline)
    dataset = DATASETS.build(dataset_cfg)
    batch = default_collate([dataset[0], dataset[1]])
    shapes = [tuple(v.shape) for v in batch['inputs']]
    assert shapes == [(2, 3, 224, 224)] * 2 + [(2, 3, 96, 96)] * 8

    MessageHub.get_current_instance().update_info('max_iters', 1000)
    # in the config's scope, as the Runner builds it (our optimiser pieces are mmpretrain's)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    first_weight = model.backbone.patch_embed.projection.weight
    before = first_weight.detach().clone()
    model.train_step(batch, optim_wrapper)   # step 0: teacher := student
    log_vars = model.train_step(batch, optim_wrapper)
    assert set(log_vars) == {'loss', 'loss_dino', 'loss_restore', 'teacher_entropy',
                             'teacher_student_kl', 'prototypes_in_use', 'masked_fraction'}
    assert all(torch.isfinite(torch.as_tensor(v)) for v in log_vars.values())
    assert not torch.equal(before, first_weight)
    assert model.head.center.abs().sum() > 0


# Every config file builds, and says where its data comes from.
OTHER_CONFIGS = sorted(
    str(p.relative_to(REPO)) for p in (REPO / 'configs').rglob('*.py')
    if str(p.relative_to(REPO)) not in PRETRAIN_CONFIGS)
# `python projects/mst_research/tools/write_X.py OUT`: the documented commands that write data
# folders (the research kit's data writers).
WRITER = re.compile(r'python (projects/mst_research/tools/write_\w+\.py) ([\w./-]+)')


@pytest.mark.parametrize('config', OTHER_CONFIGS)
def test_every_other_config_file_loads(config):
    """The _base_ pieces and the mmdet / mmseg fine-tuning configs (their scopes' modules
    are tests/test_converters/test_downstream.py's); the rest is
    test_config_loads_and_names_registered_modules."""
    cfg = Config.fromfile(str(REPO / config))
    assert cfg.to_dict()


def config_header(path: Path) -> str:
    """The first comment block of a config file."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith('#'):
            break
        lines.append(line.lstrip('#').strip())
    return ' '.join(lines)


def config_chain(path: Path) -> list:
    """The config file and the files of this repository it inherits from, nearest first."""
    chain, queue = [], [path]
    while queue:
        current = queue.pop(0)
        chain.append(current)
        tree = ast.parse(current.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    getattr(t, 'id', None) == '_base_' for t in node.targets):
                bases = ast.literal_eval(node.value)
                for base in [bases] if isinstance(bases, str) else bases:
                    if '::' not in base:
                        queue.append((current.parent / base).resolve())
    return chain


def data_roots(node) -> set:
    """Every ``data_root`` string of a config (dataloaders, k-NN references, probe hooks)."""
    if isinstance(node, dict):
        return set().union(*(({v} if k == 'data_root' and isinstance(v, str) else data_roots(v))
                             for k, v in node.items()))
    if isinstance(node, (list, tuple)):
        return set().union(*map(data_roots, node))
    return set()


def documented_writers() -> dict:
    """{output folder: command} of every data-writing command in the docs and config headers."""
    from tests.test_repository.test_docs import DOC_FILES
    texts = [p.read_text() for p in DOC_FILES]
    texts += [config_header(p) for p in (REPO / 'configs').rglob('*.py')]
    return {m.group(2).rstrip('/'): m.group(0) for text in texts for m in WRITER.finditer(text)}


def documented_data_folders() -> str:
    from tests.test_repository.test_docs import DOC_FILES
    return ' '.join(p.read_text() for p in DOC_FILES)


def unnamed_data_roots(config_path: Path, roots, writers, docs: str) -> list:
    """The data roots that are named neither in a header of the config or its bases (by the
    path, its parent folder or the documented command that writes it) nor, as a dataset's
    folder (`data/imagenet`, `data/coco/`), in the documents' data preparation."""
    headers = ' '.join(config_header(p) for p in config_chain(config_path))
    unnamed = []
    for root in sorted(roots):
        root = root.rstrip('/')
        names = [root, root.rsplit('/', 1)[0] if root.count('/') > 1 else root]
        commands = [cmd for out, cmd in writers.items() if (root + '/').startswith(out + '/')]
        dataset = '/'.join(root.split('/')[:2])
        if not (any(name in headers for name in names + commands)
                or re.search(rf'(?<![\w/.]){re.escape(dataset)}(?![\w.-])', docs)):
            unnamed.append(root)
    return unnamed


DATA_CONFIGS = [c for c in PRETRAIN_CONFIGS + OTHER_CONFIGS if '_base_' not in c]


@pytest.mark.parametrize('config', DATA_CONFIGS)
def test_every_data_root_is_named_in_the_config_header(config):
    roots = data_roots(Config.fromfile(str(REPO / config)).to_dict())
    assert roots, f'{config} reads no data_root'
    unnamed = unnamed_data_roots(REPO / config, roots, documented_writers(),
                                 documented_data_folders())
    assert not unnamed, (f'{config}: its header (first comment block, or that of a config it '
                         f'inherits) names neither {unnamed} nor the command that writes it, '
                         'and no document names its folder')


def test_the_data_root_check_catches_an_unnamed_path(tmp_path):
    base = tmp_path / 'base.py'
    base.write_text('# Reads data/x/imgs, which\n'
                    '#   python projects/mst_research/tools/write_x.py data/x\n'
                    '# writes.\ndata_root = "data/x/imgs"\n')
    child = tmp_path / 'child.py'
    child.write_text('# A child.\n_base_ = ["base.py"]\nval = dict(data_root="data/gone/val")\n')
    writers = {'data/x': 'python projects/mst_research/tools/write_x.py data/x'}
    assert config_chain(child) == [child, base.resolve()]
    assert unnamed_data_roots(child, {'data/x/imgs', 'data/x/other/deep'}, writers, '') == []
    assert unnamed_data_roots(child, {'data/gone/val', 'data/x/imgs'}, {}, '') == [
        'data/gone/val']
    docs = 'Put ImageNet in `data/gone/` as mmpretrain expects; `data/gonebut` is not it.'
    assert unnamed_data_roots(child, {'data/gone/val'}, {}, docs) == []
    assert unnamed_data_roots(child, {'data/gon/val'}, {}, docs) == ['data/gon/val']
    # The demo config as it was: a data_root that nothing writes and nothing names.
    old_demo = tmp_path / 'old_demo.py'
    old_demo.write_text('# Train on your own folder of 32-px images by changing `data_root`.\n'
                        "data_root = 'data/mst_demo/train'\n")
    assert unnamed_data_roots(old_demo, {'data/mst_demo/train'}, documented_writers(),
                              documented_data_folders()) == ['data/mst_demo/train']
    assert data_roots({'a': [dict(data_root='r1', b=dict(data_root='r2'))], 'data_root': 3}) == {
        'r1', 'r2'}


@pytest.mark.slow
def test_the_documented_command_writes_every_data_root_under_its_folder(tmp_path):
    """`python projects/mst_research/tools/write_animal_shapes.py data/animal_shapes`, run as
    documented (from a fresh folder), writes every data_root under data/animal_shapes that a
    config reads."""
    import subprocess
    import sys
    writers = documented_writers()
    out = 'data/animal_shapes'
    command = writers[out].split()
    expected = sorted({root.rstrip('/') for config in DATA_CONFIGS
                       for root in data_roots(Config.fromfile(str(REPO / config)).to_dict())
                       if root.startswith(out + '/')})
    assert len(expected) >= 3, expected   # objects/{,train,test} (the scenes' configs: the kit's)
    result = subprocess.run([sys.executable, str(REPO / command[1]), *command[2:]], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1'),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    missing = [root for root in expected if not (tmp_path / root).is_dir()]
    assert not missing, missing
    # The class folders the image datasets list.
    assert len(list((tmp_path / out / 'objects' / 'test').iterdir())) == 10
