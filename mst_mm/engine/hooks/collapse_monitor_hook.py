"""A warning when DINO self-distillation sits in one of its two collapse modes (Fig. 7)."""
import math
from typing import Optional

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model


def collapse_mode(entropy: float, kl: float, num_prototypes: int, uniform_ratio: float = 0.95,
                  one_hot_ratio: float = 0.05, kl_ratio: float = 0.01) -> Optional[str]:
    r"""``'uniform'`` (:math:`H(P_t) \ge` ``uniform_ratio`` :math:`\ln K`) or ``'one-hot'``
    (:math:`H(P_t) \le` ``one_hot_ratio`` :math:`\ln K`) while the teacher-student KL is at most
    ``kl_ratio`` :math:`\ln K`; otherwise None (a KL clearly above 0 means the run learns)."""
    log_k = math.log(num_prototypes)
    if kl > kl_ratio * log_k:
        return None
    if entropy >= uniform_ratio * log_k:
        return 'uniform'
    return 'one-hot' if entropy <= one_hot_ratio * log_k else None


@HOOKS.register_module()
class CollapseMonitorHook(Hook):
    """Warn once when ``window`` iterations in a row sit in one :func:`collapse_mode` of
    ``MST.loss``'s ``teacher_entropy`` and ``teacher_student_kl``; leaving the mode re-arms it."""
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

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        if not outputs or 'teacher_entropy' not in outputs:
            return
        # The values mmengine's RuntimeInfoHook (priority VERY_HIGH) has just read into the
        # message hub: reading the output tensors again would be another device read.
        hub = runner.message_hub
        entropy = hub.get_scalar('train/teacher_entropy').current()
        kl = hub.get_scalar('train/teacher_student_kl').current()
        num_prototypes = get_ori_model(runner.model).head.center.shape[-1]
        mode = collapse_mode(entropy, kl, num_prototypes, **self.thresholds)
        self._streak = self._streak + 1 if mode == self._mode else 1
        self._mode = mode
        if mode is not None and self._streak == self.window:
            runner.logger.warning(
                f'DINO {mode} collapse: for {self.window} iterations (up to iteration '
                f'{runner.iter + 1}) the teacher entropy H(P_t) = {entropy:.3f} (ln K = '
                f'{math.log(num_prototypes):.3f}), KL(P_t || P_s) = {kl:.4f}. Training goes on. '
                'What to change: docs/reliability.md, "Is the run learning? Collapse diagnostics".')
