"""mmengine's ``compile=True`` (``torch.compile`` of ``model.train_step``) on MST's step.

mmengine's constructor hands the optimiser ``ConfigDict`` parameter groups whenever a config
has a ``paramwise_cfg`` (all of ours do), and dynamo cannot trace the optimiser step over
them; ``StudentOptimWrapperConstructor`` gives plain dicts (tests/test_engine/test_clean_logs.py).
The ``eager`` backend runs what dynamo captured without code generation: the same
operations, so the same numbers.
"""
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

import mst_mm  # noqa: F401  (registers the model and the constructor)
from tests.helpers import DEMO_CONFIG


def demo_step():
    """The demo config's model (DINO init, seed 0), its optimiser wrapper and a batch."""
    cfg = Config.fromfile(DEMO_CONFIG)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    gen = torch.Generator().manual_seed(1)
    views = [torch.randint(0, 256, (4, 3, size, size), generator=gen).float()
             for size in (32, 32, 16, 16)]
    return model, optim_wrapper, dict(inputs=views, data_samples=None)


@pytest.mark.slow
def test_compiled_train_step_trains_as_the_eager_one(message_hub):
    """Two steps compiled (dynamo, eager backend) against two eager steps from the same
    state: the same losses and the same student and teacher afterwards."""
    losses = {}
    models = {}
    for mode in ('eager', 'compiled'):
        torch._dynamo.reset()
        model, optim_wrapper, batch = demo_step()
        step = model.train_step
        if mode == 'compiled':
            step = torch.compile(step, backend='eager')
        torch.manual_seed(2)  # drop path and the mask's draws
        losses[mode] = [{k: float(v.detach()) for k, v in step(batch, optim_wrapper).items()}
                        for _ in range(2)]
        models[mode] = model.state_dict()
    assert losses['compiled'] == losses['eager']
    assert losses['eager'][0]['loss_restore'] > 0 and losses['eager'][0]['loss_dino'] > 0
    assert losses['eager'][1]['loss'] != losses['eager'][0]['loss']  # the step did update
    for key, value in models['eager'].items():
        assert torch.equal(models['compiled'][key], value), key
