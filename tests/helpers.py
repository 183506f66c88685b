"""Shared test fixtures that build data on disk and tiny runner configs."""
import contextlib
import copy
import json
import logging
from pathlib import Path

import numpy as np
from mmengine.config import Config
from mmengine.logging import MMLogger
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = str(REPO / 'configs' / 'mst' / 'mst_vit-tiny-p4_1xb64-coslr-10e_demo.py')


def make_image_folder(root, classes=2, per_class=6, size=(40, 48), seed=0) -> str:
    """Random-texture RGB images in `root/<class>/<i>.png`; returns root."""
    rng = np.random.RandomState(seed)
    for c in range(classes):
        folder = Path(root) / f'class_{c}'
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = rng.randint(0, 256, (size[0] // 4, size[1] // 4, 3), dtype=np.uint8)
            img = np.kron(base, np.ones((4, 4, 1), dtype=np.uint8))
            Image.fromarray(img).save(folder / f'{i}.png')
    return str(root)


def tiny_runner_cfg(data_root, work_dir, max_epochs=2, batch_size=4,
                    teacher_temp_warmup=2) -> Config:
    """The demo config, shrunk to a few iterations on `data_root`."""
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.work_dir = str(work_dir)
    cfg.train_dataloader.dataset.data_root = data_root
    cfg.train_dataloader.batch_size = batch_size
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_cfg.max_epochs = max_epochs
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
             convert_to_iter_based=True),
        dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=1,
             end=max_epochs, convert_to_iter_based=True),
        dict(type='CosineAnnealingParamScheduler', param_name='weight_decay',
             eta_min_ratio=10.0, by_epoch=True, begin=0, end=max_epochs,
             convert_to_iter_based=True),
    ]
    cfg.custom_hooks = [
        dict(type='TeacherTempWarmupHook', start=0.04, end=0.07,
             warmup_epochs=teacher_temp_warmup),
        dict(type='FreezeLastLayerHook', freeze_epochs=1),
    ]
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint.interval = max_epochs
    cfg.log_level = 'WARNING'
    return cfg


def scalars(work_dir, all_runs: bool = False) -> list:
    """The json lines that mmengine's LocalVisBackend wrote for the latest run in
    `work_dir` (``<timestamp>/vis_data/scalars.json``), or for every run in it, oldest first
    (a resumed run writes a folder of its own)."""
    files = sorted(Path(work_dir).glob('*/vis_data/scalars.json'))
    assert files, f'no */vis_data/scalars.json under {work_dir}'
    return [json.loads(line) for path in (files if all_runs else files[-1:])
            for line in path.read_text().splitlines() if line.strip()]


def model_for_training(cfg: Config) -> tuple:
    """The config's model in training mode on the CPU (seed 0), and its optimiser wrapper
    built in the config's scope, as the runner builds them."""
    import torch
    from mmengine.logging import MessageHub
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    MessageHub.get_current_instance().update_info('max_iters', 10_000)  # CosineEMA reads it
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmpretrain')):
        return model, build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))


def random_views(cfg: Config, batch_size: int) -> dict:
    """A batch as the data workers give it to the preprocessor: random 0-255 views of the
    sizes of the config's MultiCrop, one (B, 3, S, S) tensor per view (seed 0)."""
    import torch
    crop = next(step for step in cfg.train_dataloader.dataset.pipeline
                if step['type'] == 'MultiCrop')
    sizes = [crop['global_size']] * 2 + [crop['local_size']] * crop['num_local_crops']
    generator = torch.Generator().manual_seed(0)
    return dict(inputs=[torch.randint(0, 256, (batch_size, 3, size, size),
                                      generator=generator).float() for size in sizes],
                data_samples=None)


def load_tool(relative_path: str):
    """Import a script under tools/ (not a package) as a module, to call its main()."""
    import importlib.util
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def mmlogger_records():
    """Every log record that mmengine's current logger emits inside the block, whatever
    level an earlier test or tool left it at."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    previous_level = logger.level
    logger.setLevel(logging.NOTSET)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
