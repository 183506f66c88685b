"""A warning when DINO self-distillation sits in one of its two collapse modes."""
import math
from typing import Optional

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model

UNIFORM, ONE_HOT = 'uniform', 'one-hot'


def collapse_mode(entropy: float, kl: float, num_prototypes: int,
                  uniform_ratio: float = 0.95, one_hot_ratio: float = 0.05,
                  kl_ratio: float = 0.01) -> Optional[str]:
    r"""Which DINO collapse mode (paper, Fig. 7) the diagnostics show, if any.

    Uniform collapse drives :math:`H(P_t)` to :math:`\ln K`, one-hot collapse to 0; in both
    the teacher-student KL goes to 0, so a KL clearly above 0 means the run is learning.

    Args:
        entropy (float): Mean teacher entropy :math:`H(P_t)` in nats.
        kl (float): Mean teacher-student KL divergence in nats.
        num_prototypes (int): K.
        uniform_ratio (float): Uniform when :math:`H \ge` this :math:`\times \ln K`.
        one_hot_ratio (float): One-hot when :math:`H \le` this :math:`\times \ln K`.
        kl_ratio (float): Collapsed only while :math:`KL \le` this :math:`\times \ln K`.

    Returns:
        str | None: ``'uniform'``, ``'one-hot'`` or None.
    """
    log_k = math.log(num_prototypes)
    if kl > kl_ratio * log_k:
        return None
    if entropy >= uniform_ratio * log_k:
        return UNIFORM
    if entropy <= one_hot_ratio * log_k:
        return ONE_HOT
    return None


@HOOKS.register_module()
class CollapseMonitorHook(Hook):
    """Warns, naming the mode and what to change, when a run sits in a collapse mode.

    Reads ``teacher_entropy`` and ``teacher_student_kl`` from ``MST.loss``'s outputs; runs
    without them (k-NN, linear probing) are ignored. See docs/reliability.md.

    Args:
        window (int): Iterations in a row in one mode before warning (1000: ~1 ImageNet epoch).
        uniform_ratio (float): See :func:`collapse_mode`.
        one_hot_ratio (float): See :func:`collapse_mode`.
        kl_ratio (float): See :func:`collapse_mode`.
    """
    priority = 'BELOW_NORMAL'

    def __init__(self, window: int = 1000, uniform_ratio: float = 0.95,
                 one_hot_ratio: float = 0.05, kl_ratio: float = 0.01) -> None:
        if window < 1:
            raise ValueError(f'CollapseMonitorHook window must be >= 1, got {window}.')
        if not 0 <= one_hot_ratio < uniform_ratio <= 1:
            raise ValueError('CollapseMonitorHook needs 0 <= one_hot_ratio < uniform_ratio '
                             f'<= 1, got {one_hot_ratio} and {uniform_ratio}.')
        self.window = window
        self.thresholds = dict(uniform_ratio=uniform_ratio, one_hot_ratio=one_hot_ratio,
                               kl_ratio=kl_ratio)
        self._mode: Optional[str] = None
        self._streak = 0
        self._warned = False

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        if not outputs or 'teacher_entropy' not in outputs:
            return
        entropy = float(outputs['teacher_entropy'])
        kl = float(outputs['teacher_student_kl'])
        num_prototypes = get_ori_model(runner.model).head.center.shape[-1]
        mode = collapse_mode(entropy, kl, num_prototypes, **self.thresholds)
        if mode != self._mode:
            self._mode, self._streak, self._warned = mode, 0, False
        if mode is None:
            return
        self._streak += 1
        if self._streak >= self.window and not self._warned:
            self._warned = True
            runner.logger.warning(
                f'DINO {mode} collapse: for {self._streak} iterations (up to iteration '
                f'{runner.iter + 1}) the teacher entropy H(P_t) = {entropy:.3f} '
                f'(ln K = {math.log(num_prototypes):.3f}) and the teacher-student KL = '
                f'{kl:.4f}. Training goes on; this is only a warning. What to change: '
                'docs/reliability.md, "Is the run learning? Collapse diagnostics".')
