import copy
import itertools

import pytest
import torch
from mmengine.logging import MessageHub

from mst_mm.compat import CPU_BFLOAT16_BACKWARD_CORRUPTS

#: Tests that train under CPU bfloat16 autocast with torch's CPU GradScaler: torch 2.1 has no
#: CPU GradScaler (2.3), and its CPU attention corrupts memory in the bfloat16 backward.
cpu_mixed_precision_training = pytest.mark.skipif(
    CPU_BFLOAT16_BACKWARD_CORRUPTS or not hasattr(torch.amp, 'GradScaler'),
    reason=f'torch {torch.__version__}: no CPU GradScaler (torch 2.3), or a CPU attention '
    'kernel that corrupts memory in its bfloat16 backward (torch 2.1; mst_mm.compat)')

TINY_ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)

TINY_MST = dict(
    type='MST',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[64.] * 3,
                           to_rgb=True),
    backbone=dict(type='MaskViT', arch=TINY_ARCH, img_size=32, patch_size=8,
                  drop_path_rate=0.1),
    neck=dict(type='DINONeck', in_channels=32, hidden_channels=64, bottleneck_channels=16,
              out_channels=128),
    head=dict(type='DINODistillHead', out_channels=128),
    decoder_head=dict(type='ImageDecoderHead', in_channels=32, channels=(16, 8, 8)),
    mask_cfg=dict(num=4, p=0.5, mode='attention'),
)


def tiny_mst_cfg(**overrides) -> dict:
    cfg = copy.deepcopy(TINY_MST)
    cfg.update(overrides)
    return cfg


_HUB_IDS = itertools.count()


@pytest.fixture
def message_hub():
    """CosineEMA reads `max_iters` from the message hub, as inside a runner."""
    # A new name each time: mmengine's current hub (what CosineEMA reads) is the one created
    # last, and a name used before would be returned without becoming current again.
    hub = MessageHub.get_instance(f'mst_test_{next(_HUB_IDS)}')
    hub.update_info('max_iters', 100)
    return hub


def crops(batch=4, n_local=3, global_size=32, local_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return ([torch.randn(batch, 3, global_size, global_size, generator=gen) for _ in range(2)]
            + [torch.randn(batch, 3, local_size, local_size, generator=gen)
               for _ in range(n_local)])


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A tool's main() run in-process may set torch's thread count (the benchmarks set 1): put
    it back, so that later tests compute as a fresh process does (float sums depend on it)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
