"""What the research kit's tests share: the repository's paths, a tool loaded as a module, the
scalar logs of a run, hand-computed k-NN, the demo model and a stand-in DINO clone.

The kit's tests are a folder of their own (no package), so they import this module by its
name; they read nothing from the plugin's tests.
"""
import importlib.util
import json
import statistics
from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from mst_mm.compat import CPU_BFLOAT16_BACKWARD_CORRUPTS

REPO = Path(__file__).resolve().parents[3]
DEMO_CONFIG = str(REPO / 'configs' / 'mst' / 'mst_vit-tiny-p4_1xb64-coslr-10e_demo.py')

#: Tests that train under CPU bfloat16 autocast with torch's CPU GradScaler: torch 2.1 has no
#: CPU GradScaler (2.3), and its CPU attention corrupts memory in the bfloat16 backward.
cpu_mixed_precision_training = pytest.mark.skipif(
    CPU_BFLOAT16_BACKWARD_CORRUPTS or not hasattr(torch.amp, 'GradScaler'),
    reason=f'torch {torch.__version__}: no CPU GradScaler (torch 2.3), or a CPU attention '
    'kernel that corrupts memory in its bfloat16 backward (torch 2.1; mst_mm.compat)')


def load_tool(relative_path: str):
    """Import a tool script (not a package) by its repository path, to call its main()."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scalars(work_dir, all_runs: bool = False) -> list:
    """The json lines that mmengine's LocalVisBackend wrote for the latest run in
    `work_dir` (``<timestamp>/vis_data/scalars.json``), or for every run in it, oldest first."""
    files = sorted(Path(work_dir).glob('*/vis_data/scalars.json'))
    assert files, f'no */vis_data/scalars.json under {work_dir}'
    return [json.loads(line) for path in (files if all_runs else files[-1:])
            for line in path.read_text().splitlines() if line.strip()]


def mean_std(values: List[float], digits: int = 1) -> str:
    """The evidence tool's cell: the mean, and the sample std when there are several runs."""
    if len(values) == 1:
        return f'{values[0]:.{digits}f}'
    return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def read_split(root, split, preprocessor):
    """``root/split/<class>/*.png`` read with PIL (RGB) and normalised by hand with the
    preprocessor's statistics, and their labels (sorted class folders, sorted files)."""
    paths = sorted(Path(root, split).glob('*/*.png'))
    images = np.stack([np.array(Image.open(p).convert('RGB')) for p in paths])
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    x = (x - preprocessor.mean.reshape(1, 3, 1, 1)) / preprocessor.std.reshape(1, 3, 1, 1)
    classes = sorted({p.parent.name for p in paths})
    return x, torch.tensor([classes.index(p.parent.name) for p in paths])


def hand_knn_top1(embed, preprocessor, root, ks, splits=('train', 'val'), t=0.07) -> dict:
    """Brute-force weighted k-NN top-1 (%) of ``embed``'s features of the two splits: each
    query's k most cosine-similar training images vote exp(similarity / t) for their class."""
    with torch.no_grad():
        (train, train_labels), (val, val_labels) = (
            (embed(x), labels) for x, labels in (read_split(root, s, preprocessor)
                                                 for s in splits))
    train = train / train.norm(dim=1, keepdim=True)
    val = val / val.norm(dim=1, keepdim=True)
    num_classes = int(train_labels.max()) + 1
    result = {}
    for k in ks:
        votes = torch.zeros(len(val), num_classes, dtype=torch.float64)
        for i, query in enumerate(val.double()):
            sims = sorted(((float(query @ x.double()), int(y))
                           for x, y in zip(train, train_labels)), key=lambda s: -s[0])
            for sim, y in sims[:min(k, len(train))]:
                votes[i, y] += torch.exp(torch.tensor(sim / t, dtype=torch.float64))
        result[k] = float((votes.argmax(1) == val_labels).float().mean() * 100)
    return result


def demo_model():
    """The demo config's MST model (seed 0) with its EMA teacher set to the student."""
    from mmpretrain.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(DEMO_CONFIG).model)
    model.init_weights()
    model.teacher.update_parameters(torch.nn.Sequential(model.backbone, model.neck))
    return model


# A stand-in for a facebookresearch/dino clone: the three modules the reference step
# imports, with DINO's names and signatures, each call written to calls.txt beside them.
STAND_IN = {
    'main_dino.py': '''
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from utils import record  # DINO's scripts import each other by top-level name


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp,
                 warmup_teacher_temp_epochs, nepochs, student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.ncrops = ncrops
        self.register_buffer('center', torch.zeros(1, out_dim))
        record(f'loss_init {out_dim} {ncrops} {teacher_temp} {student_temp}')

    def forward(self, student_output, teacher_output, epoch):
        record(f'loss {tuple(student_output.shape)} {tuple(teacher_output.shape)} '
               f'{dist.get_world_size()}')
        target = F.softmax(teacher_output.chunk(2)[0], dim=-1).detach()
        return -(target * F.log_softmax(student_output.chunk(self.ncrops)[1], -1)).sum(-1).mean()
''',
    'utils.py': '''
import os

import torch
import torch.nn as nn

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'calls.txt')


def record(line):
    with open(CALLS, 'a') as f:
        f.write(line + '\\n')


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x):
        return self.head(torch.cat([self.backbone(crop) for crop in x]))


def get_params_groups(model):
    return [{'params': [p for p in model.parameters() if p.requires_grad]}]


def clip_gradients(model, clip):
    record(f'clip {clip}')
    return []


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    record(f'cancel {epoch} {freeze_last_layer}')
''',
    'vision_transformer.py': '''
import torch.nn as nn


class VisionTransformer(nn.Module):
    def __init__(self, img_size, patch_size, embed_dim, depth, num_heads, mlp_ratio,
                 qkv_bias, norm_layer, drop_path_rate):
        super().__init__()
        self.embed_dim = embed_dim
        self.patch = nn.Conv2d(3, embed_dim, patch_size, patch_size)

    def forward(self, x):
        return self.patch(x).mean(dim=(2, 3))


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, use_bn=False, norm_last_layer=True, nlayers=3,
                 hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        self.mlp = nn.Linear(in_dim, out_dim)

    def forward(self, x):
        return self.mlp(x)
''',
}


def stand_in_dino(folder):
    folder.mkdir()
    for name, text in STAND_IN.items():
        (folder / name).write_text(text)
    return folder
