"""DINO's self-distillation loss with centring and sharpening (paper Eq. 2)."""
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from mmengine.dist import all_reduce, get_world_size
from mmengine.model import BaseModule
from mmpretrain.registry import MODELS

from ..utils.precision import float32_region


@MODELS.register_module()
class DINODistillHead(BaseModule):
    r"""Cross-entropy between teacher and student over every pair of different crops.

    .. math::
        L_{CE} = \frac{1}{P}\sum_{i\in\{1,2\}}\sum_{j\neq i}^{N+2}
                 -\,\mathrm{softmax}\Big(\frac{O_t(x_i) - c}{\tau_t}\Big)\cdot
                 \log\mathrm{softmax}\Big(\frac{O_s(x_j)}{\tau_s}\Big)

    averaged over the batch and over the :math:`P` pairs (Eq. 2). After each loss the centre
    :math:`c` moves towards the mean teacher output of the global crops, averaged over all
    ranks: :math:`c \leftarrow m c + (1 - m)\,\overline{O_t}`.

    Args:
        out_channels (int): Number of prototypes K.
        num_global_crops (int): The crops the teacher sees. Defaults to 2.
        student_temp (float): :math:`\tau_s`. Defaults to 0.1.
        teacher_temp (float): :math:`\tau_t` at start; ``TeacherTempWarmupHook`` schedules it.
            Defaults to 0.04.
        center_momentum (float): :math:`m`. Defaults to 0.9.
        loss_weight (float): :math:`\lambda_1` of Eq. 12. Defaults to 1.0.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(self,
                 out_channels: int,
                 num_global_crops: int = 2,
                 student_temp: float = 0.1,
                 teacher_temp: float = 0.04,
                 center_momentum: float = 0.9,
                 loss_weight: float = 1.0,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if loss_weight < 0:
            raise ValueError(f'DINODistillHead loss_weight must be >= 0, got {loss_weight}.')
        if student_temp <= 0 or teacher_temp <= 0:
            raise ValueError('DINO temperatures must be > 0, got '
                             f'student_temp={student_temp}, teacher_temp={teacher_temp}.')
        self.num_global_crops = num_global_crops
        self.student_temp = student_temp
        self.teacher_temp = teacher_temp
        self.center_momentum = center_momentum
        self.loss_weight = loss_weight
        self.register_buffer('center', torch.zeros(1, out_channels))

    def loss(self, student_out: torch.Tensor, teacher_out: torch.Tensor) -> torch.Tensor:
        """Weighted DINO loss; updates the centre.

        Args:
            student_out (Tensor): (V * B, K) logits of all V crops, crop-major
                (global crops first, in the teacher's order).
            teacher_out (Tensor): (G * B, K) teacher logits of the G global crops.

        Returns:
            Tensor: :math:`\\lambda_1 L_{CE}`, a scalar.
        """
        return self.loss_and_diagnostics(student_out, teacher_out)['loss_dino']

    def loss_and_diagnostics(self, student_out: torch.Tensor,
                             teacher_out: torch.Tensor) -> Dict[str, torch.Tensor]:
        r"""The weighted DINO loss and the collapse diagnostics of DINO's Fig. 7.

        From the tensors of the loss, no extra forward pass (all detached, unweighted):

        - ``teacher_entropy``: :math:`H(P_t)`, the mean entropy of the teacher's centred and
          sharpened distributions. Uniform collapse drives it to :math:`\ln K`, one-hot
          collapse to 0.
        - ``teacher_student_kl``: :math:`L_{CE} - H(P_t)`, the mean KL divergence from the
          student to the teacher over the loss's pairs. Both collapse modes drive it to 0.
        - ``prototypes_in_use``: :math:`\exp H(\bar P_t)`, the perplexity of the batch-mean
          teacher distribution: about K when the batch spreads over all prototypes, 1 when
          every sample picks the same one.

        Args:
            student_out (Tensor): As for :meth:`loss`.
            teacher_out (Tensor): As for :meth:`loss`.

        Returns:
            dict: ``loss_dino`` (:math:`\lambda_1 L_{CE}`, with gradient) and the three
            diagnostics above.
        """
        num_global = self.num_global_crops
        num_crops = student_out.shape[0] * num_global // teacher_out.shape[0]
        batch = teacher_out.shape[0] // num_global
        # Under AMP the logits arrive in half precision: one float32 copy of each, shared
        # by the loss and the centre update (a no-op in float32).
        teacher_out = teacher_out.float()
        student_logp = F.log_softmax(student_out.float() / self.student_temp, dim=-1)
        teacher_p = F.softmax((teacher_out - self.center) / self.teacher_temp, dim=-1)
        teacher_p = teacher_p.detach()

        # Every (teacher crop i, student crop j) cross-entropy at once: one matrix product
        # over batch and prototypes gives the (G, V) table of sum_b sum_k -p_i log q_j,
        # instead of a Python loop over the G * (V - 1) pairs; then the pairs of a crop
        # with itself (j == i) are left out. In float32 under autocast too, as the loop's
        # elementwise products were.
        with float32_region(teacher_p.device):
            pair_sums = -torch.mm(teacher_p.reshape(num_global, -1),
                                  student_logp.reshape(num_crops, -1).t())
        # The pairs j != i in row-major order, as a boolean mask off the diagonal would pick
        # them, but by position: the m-th is entry m + 1 + m // V of the flat table (each
        # teacher crop is among the V student crops). The mask's `nonzero` would be a host
        # synchronisation, in the forward and again in the backward.
        kept = torch.arange(num_global * (num_crops - 1), device=pair_sums.device)
        other_views = pair_sums.flatten().gather(0, kept + 1 + kept // num_crops)
        self.update_center(teacher_out)
        pairs = num_global * num_crops - min(num_global, num_crops)
        cross_entropy = other_views.sum() / (batch * pairs)
        with torch.no_grad():
            # Every teacher crop meets the same number of student crops, so the pairs'
            # mean teacher entropy is the plain mean over the teacher's samples.
            entropy = torch.special.entr(teacher_p).sum(dim=-1).mean()
            prototypes = torch.special.entr(teacher_p.mean(dim=0)).sum().exp()
        return dict(loss_dino=self.loss_weight * cross_entropy,
                    teacher_entropy=entropy,
                    teacher_student_kl=cross_entropy.detach() - entropy,
                    prototypes_in_use=prototypes)

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """EMA of the teacher's mean output, all-reduced across ranks."""
        batch_center = teacher_out.float().sum(dim=0, keepdim=True)
        all_reduce(batch_center)  # sum over ranks; a no-op without distributed training
        batch_center = batch_center / (teacher_out.shape[0] * get_world_size())
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)
