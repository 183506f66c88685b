"""Check that an installed stack works: imports, the mmcv flavour, and one tiny MST step.

``tools/setup_env.sh`` runs it after every install and the wheelhouse test runs it in a
fresh environment, so both share this one check::

    python tools/stack_check.py                 # pretraining stack (mmcv-lite is enough)
    python tools/stack_check.py --ops           # also mmcv's compiled ops, mmdet and mmseg
    python tools/stack_check.py --pinned-torch  # also the registry torch of requirements/
    python tools/stack_check.py --installed-mmcv  # print the mmcv flavour and its providers

It prints one line per check and exits non-zero, naming the problem and its fix, at the
first failure.
"""
import argparse
import importlib.metadata as metadata
import math
import sys
from typing import Callable, List, Optional, Tuple

# The smallest MST that still runs every part of Algorithm 2: multi-crop, attention-guided
# mask, decoder, EMA teacher. A step takes well under a second on one CPU core.
_TINY_ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)
_TINY_MST = dict(
    type='MST',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[64.] * 3,
                           to_rgb=True),
    backbone=dict(type='MaskViT', arch=_TINY_ARCH, img_size=32, patch_size=8),
    neck=dict(type='DINONeck', in_channels=32, hidden_channels=64, bottleneck_channels=16,
              out_channels=128),
    head=dict(type='DINODistillHead', out_channels=128),
    decoder_head=dict(type='ImageDecoderHead', in_channels=32, channels=(16, 8, 8)),
    mask_cfg=dict(num=4, p=0.5, mode='attention'),
)


class StackError(RuntimeError):
    """An installed stack that cannot run mst_mm; the message names the fix."""


def mmcv_providers() -> List[str]:
    """The installed distributions that provide the ``mmcv`` package (``mmcv``, ``mmcv-lite``,
    ``onedl-mmcv``, ...), read from package metadata (no import)."""
    return sorted(set(metadata.packages_distributions().get('mmcv', [])))


def installed_mmcv_flavour() -> Optional[str]:
    """Which kind of mmcv is installed, read from package metadata (no import).

    Returns:
        ``'ops'`` for a provider with the compiled extension (``mmcv``, ``onedl-mmcv``),
        ``'lite'`` for ``mmcv-lite``, ``'both'`` when two distributions provide mmcv (they
        write the same files, so one of them is broken), ``'no-ops'`` for a provider without
        the extension, and ``None`` when none is installed.
    """
    providers = mmcv_providers()
    if len(providers) > 1:
        return 'both'
    if not providers:
        return None
    if providers == ['mmcv-lite']:
        return 'lite'
    files = metadata.distribution(providers[0]).files or []
    return 'ops' if any(str(f).startswith('mmcv/_ext') for f in files) else 'no-ops'


def _check_versions(pinned_torch: bool) -> str:
    import numpy
    import setuptools
    import torch
    import torchvision

    if int(setuptools.__version__.split('.')[0]) >= 82:
        raise StackError(f'setuptools {setuptools.__version__} has no pkg_resources, which '
                         'mmengine needs for mmdet::/mmseg:: configs; install "setuptools<82"')
    if pinned_torch and torch.__version__.endswith('+cpu'):
        raise StackError(f'torch {torch.__version__}: the registry torchvision does not run '
                         'beside a +cpu torch; install "torch===2.13.0" "torchvision==0.28.0"')
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    if keep.tolist() != [0, 2]:
        raise StackError(f'torchvision.ops.nms gave {keep.tolist()}, expected [0, 2]')
    return (f'numpy {numpy.__version__}, setuptools {setuptools.__version__}, '
            f'torch {torch.__version__}, torchvision {torchvision.__version__}')


def _check_mmcv(ops: bool) -> str:
    flavour = installed_mmcv_flavour()
    if flavour in (None, 'both', 'no-ops'):
        raise StackError(f'mmcv state {flavour!r} ({", ".join(mmcv_providers()) or "none"}): '
                         'install exactly one provider of mmcv: mmcv-lite, or mmcv or '
                         'onedl-mmcv built with ops (tools/setup_env.sh does this)')
    if ops and flavour != 'ops':
        raise StackError('mmcv-lite has no compiled ops, which mmdet and mmseg need: run '
                         'tools/setup_env.sh --ops (it replaces mmcv-lite by the compiled mmcv)')
    import mmcv
    if ops:
        import torch
        from mmcv.ops import RoIAlign, nms
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
        _, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
        pooled = RoIAlign(output_size=(2, 2), spatial_scale=1.0, sampling_ratio=2)(
            torch.full((1, 1, 8, 8), 3.0), torch.tensor([[0., 1., 1., 6., 6.]]))
        if keep.tolist() != [0, 2] or not torch.allclose(pooled, torch.full_like(pooled, 3.)):
            raise StackError('mmcv.ops nms / RoIAlign give wrong results: rebuild mmcv')
    return f'mmcv {mmcv.__version__} ({flavour}, {mmcv_providers()[0]})'


def _check_imports(ops: bool) -> str:
    import mmengine
    import mmpretrain
    import mmpretrain.models  # noqa: F401

    import mst_mm
    # Versions from the modules: OneDL's distributions have other names (onedl-mmpretrain).
    names = [f'mmengine {mmengine.__version__}',
             f'mmpretrain {mmpretrain.__version__}', f'mst_mm {mst_mm.__version__}']
    if ops:
        import mmdet
        import mmdet.models  # noqa: F401
        import mmseg
        import mmseg.models  # noqa: F401
        names += [f'mmdet {mmdet.__version__}', f'mmsegmentation {mmseg.__version__}']
    return ', '.join(names)


def _check_mst_step() -> str:
    import torch
    from mmengine.logging import MessageHub, MMLogger
    from mmpretrain.registry import MODELS

    import mst_mm  # noqa: F401  (registers MST)

    # The current logger: init_weights would otherwise print every parameter at INFO.
    MMLogger.get_instance('mst_stack_check', log_level='WARNING')
    MessageHub.get_instance('mst_stack_check').update_info('max_iters', 10)
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = MODELS.build(_TINY_MST)
    model.init_weights()
    model.train()
    views = ([torch.randn(2, 3, 32, 32, generator=generator) for _ in range(2)]
             + [torch.randn(2, 3, 16, 16, generator=generator) for _ in range(2)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = model.backbone.patch_embed.projection.weight.detach().clone()
    losses = model.loss(views, [])
    values = {name: float(value.detach()) for name, value in losses.items()}
    total = losses['loss_dino'] + losses['loss_restore']
    if not all(math.isfinite(values[k]) for k in ('loss_dino', 'loss_restore')):
        raise StackError(f'the tiny MST step gave non-finite losses: {values}')
    optimizer.zero_grad()
    total.backward()
    optimizer.step()
    if torch.equal(before, model.backbone.patch_embed.projection.weight):
        raise StackError('the tiny MST step did not change the student')
    return (f'loss_dino {values["loss_dino"]:.4f}, loss_restore {values["loss_restore"]:.4f}, '
            'student updated')


def run_stack_check(ops: bool = False, pinned_torch: bool = False,
                    echo: Callable[[str], None] = print) -> List[Tuple[str, str]]:
    """Run every check in order; stop at the first failure.

    Args:
        ops (bool): Require the compiled mmcv and import mmdet and mmseg (fine-tuning,
            tests). Without it mmcv-lite is enough (pretraining, k-NN, linear probe).
        pinned_torch (bool): Require the registry torch build that requirements/torch.txt
            pins (not a ``+cpu`` local build). Leave it off for a user's own CUDA torch.
        echo (Callable[[str], None]): Receives one line per passed check.

    Returns:
        list[tuple[str, str]]: ``(check, what it found)`` for every check.

    Raises:
        StackError: The first failed check, with its fix.
    """
    checks = [('versions', lambda: _check_versions(pinned_torch)),
              ('mmcv', lambda: _check_mmcv(ops)),
              ('imports', lambda: _check_imports(ops)),
              ('mst step', _check_mst_step)]
    results = []
    for name, check in checks:
        try:
            found = check()
        except ImportError as error:
            raise StackError(f'{name}: {error}; install the stack with tools/setup_env.sh') \
                from error
        results.append((name, found))
        echo(f'[stack_check] {name}: {found}')
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--ops', action='store_true',
                        help='require the compiled mmcv and import mmdet and mmseg')
    parser.add_argument('--pinned-torch', action='store_true',
                        help='require the registry torch build of requirements/torch.txt')
    parser.add_argument('--installed-mmcv', action='store_true',
                        help="print the mmcv flavour (ops, lite, both, no-ops, none) and its "
                        "providers ('-' for none), comma-separated, and check nothing")
    args = parser.parse_args(argv)
    if args.installed_mmcv:
        print(installed_mmcv_flavour() or 'none', ','.join(mmcv_providers()) or '-')
        return 0
    try:
        run_stack_check(ops=args.ops, pinned_torch=args.pinned_torch)
    except StackError as error:
        print(f'[stack_check] FAILED: {error}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
