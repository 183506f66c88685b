"""MST: Masked Self-Supervised Transformer (paper Algorithm 2)."""
import copy
import math
from itertools import groupby
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from mmengine.logging import MessageHub
from mmpretrain.models import BaseSelfSupervisor
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

from ..backbones import MSTFeatures
from ..utils import FusedCosineEMA, attention_mask, check_mask_args
from ..utils.channel_check import ChannelMismatchError, channel_mismatches

#: Where an MST state dict keeps each network: ``teacher`` is the EMA wrapper (backbone,
#: neck), so checkpoint readers and converters take these prefixes from here.
BACKBONE_PREFIXES = {'teacher': 'teacher.module.0.', 'student': 'backbone.'}
NECK_PREFIXES = {'teacher': 'teacher.module.1.', 'student': 'neck.'}
#: Parameters that only pretraining uses: the student's [MASK] token.
PRETRAIN_ONLY_KEYS = ('mask_token', )

#: Model overrides that turn an MST config into its DINO baseline: no mask, no decoder.
DINO_MODE = dict(mask_cfg=dict(mode='none'), decoder_head=None)


@MODELS.register_module()
class MST(BaseSelfSupervisor):
    r"""DINO self-distillation + attention-guided masking + global image decoder.

    The student sees the global crops with the lowest-attention patches replaced by [MASK]
    (the teacher's CLS attention on the same crop picks them) and every local crop unmasked;
    a conv decoder restores the global crops from the student's patch features. The loss is
    Eq. 12:

    .. math::
        L_{total} = \lambda_1 L_{CE} + \lambda_2 L_{restoring}

    with :math:`\lambda_1` = ``head.loss_weight`` and :math:`\lambda_2` =
    ``decoder_head.loss_weight``. The teacher is an EMA of backbone + neck (Eq. 1), updated
    in :meth:`loss` so that every runner gets it.

    Args:
        backbone (dict): A mask-aware backbone with ``forward_mst`` (``MaskViT``).
        neck (dict): The projection head (``DINONeck``).
        head (dict): The self-distillation loss (``DINODistillHead``).
        decoder_head (dict, optional): The image decoder (``ImageDecoderHead``); None turns
            restoration off (the DINO baseline).
        mask_cfg (dict): ``num``, ``p`` and ``mode`` of :func:`attention_mask`.
            Defaults to ``dict(num=8, p=0.1, mode='attention')``.
        num_global_crops (int): The first crops of each sample are the global ones.
            Defaults to 2.
        base_momentum (float): Teacher EMA momentum in mmengine's convention, the weight of
            the *new* value: DINO's 0.996 is 0.004. Defaults to 0.004.
        end_momentum (float): Momentum at the end of training (DINO's 1.0 is 0.0).
        data_preprocessor (dict, optional): Defaults to ``SelfSupDataPreprocessor``.
        init_cfg (dict, optional): Initialization config.
    """

    def __init__(self,
                 backbone: dict,
                 neck: dict,
                 head: dict,
                 decoder_head: Optional[dict] = None,
                 mask_cfg: Optional[dict] = None,
                 num_global_crops: int = 2,
                 base_momentum: float = 0.004,
                 end_momentum: float = 0.,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(
            backbone=backbone, neck=neck, head=head,
            data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.mask_cfg = {**dict(num=8, p=0.1, mode='attention'), **(mask_cfg or {})}
        check_mask_args(**self.mask_cfg)
        self.num_global_crops = num_global_crops
        self.decoder_head = MODELS.build(decoder_head) if decoder_head else None
        self._check_channels(backbone)
        if self.decoder_head is not None:
            self._check_decoder_reaches_input_size()

        # The teacher is built, not deep-copied: it has no drop-path and no [MASK] token.
        # The EMA pairs its parameters with the student's by name, so the student's extra
        # mask token and decoder are simply not averaged. FusedCosineEMA is mmpretrain's
        # CosineEMA (same rule and state dict) with one fused update per step.
        teacher_backbone = copy.deepcopy(backbone)
        teacher_backbone.update(drop_path_rate=0., use_mask_token=False)
        teacher = nn.Sequential(MODELS.build(teacher_backbone), MODELS.build(copy.deepcopy(neck)))
        teacher.load_state_dict(self._student().state_dict(), strict=False)
        self.teacher = FusedCosineEMA(teacher, momentum=base_momentum, end_momentum=end_momentum)

    def _check_channels(self, backbone_cfg: dict) -> None:
        """Refuse, at build time, widths that would only fail at the first iteration.

        Args:
            backbone_cfg (dict): The backbone's config, to name its arch in the message.
        """
        problems = channel_mismatches(self.backbone, self.neck, self.head, self.decoder_head,
                                      backbone_cfg)
        if problems:
            raise ChannelMismatchError(
                "MST's parts do not fit together:\n- " + '\n- '.join(problems))

    def _check_decoder_reaches_input_size(self) -> None:
        stride, factor = self.backbone.feat_stride, self.decoder_head.upsample_factor
        if factor == stride:
            return
        stages = stride.bit_length() - 1
        fix = (f'give decoder_head.channels {stages} stages (one per 2x)'
               if 2**stages == stride else 'use a power-of-two patch size')
        raise ValueError(f'The decoder upsamples {factor}x but the backbone has {stride}-pixel '
                         f'patches, so the restored image would not match the input: {fix}.')

    def _student(self) -> nn.Sequential:
        return nn.Sequential(self.backbone, self.neck)

    def loss(self, inputs: List[torch.Tensor], data_samples: List[DataSample],
             **kwargs) -> Dict[str, torch.Tensor]:
        """Algorithm 2 for one batch.

        Args:
            inputs (List[Tensor]): The crops of the batch, one (B, 3, H, W) tensor per view,
                global views first (``MultiView`` order).
            data_samples (List[DataSample]): Unused.

        Returns:
            dict: ``loss_dino`` and, with a decoder, ``loss_restore``, both weighted; the
            collapse diagnostics of :meth:`DINODistillHead.loss_and_diagnostics` and
            ``masked_fraction`` (the share of global-crop patches replaced by [MASK]),
            which are logged but not summed into the loss (their names hold no ``loss``).
        """
        global_crops = torch.cat(inputs[:self.num_global_crops])
        local_crops = inputs[self.num_global_crops:]
        with torch.no_grad():
            # mmpretrain's DINO project builds an EMA teacher and never updates it.
            self.teacher.update_parameters(self._student())
            teacher_backbone, teacher_neck = self.teacher.module
            t_feats = teacher_backbone.forward_mst(
                global_crops, with_attn=self.mask_cfg['mode'] == 'attention', with_patches=False)
            teacher_out = teacher_neck(t_feats.global_feat)
            mask = self._mask(t_feats)

        # Only the decoder reads patch features; the rest of the step needs CLS tokens.
        s_global = self.backbone.forward_mst(global_crops, mask=mask,
                                             with_patches=self.decoder_head is not None)
        s_local = [self.backbone.forward_mst(same_size, with_patches=False).global_feat
                   for same_size in self._same_size_batches(local_crops)]
        student_out = self.neck.forward_crops(s_global.global_feat, s_local)

        # loss_dino, plus the collapse diagnostics that mmengine logs beside it
        losses = self.head.loss_and_diagnostics(student_out, teacher_out)
        # The share of global-crop patches the student saw as [MASK]: about p / num with
        # mode='attention' (1.25 % at num=8, p=0.1), p with mode='random' (10 %).
        losses['masked_fraction'] = mask.float().mean()
        if self.decoder_head is not None:
            losses['loss_restore'] = self.decoder_head.loss(s_global.feat_map, global_crops)
        return losses

    def parse_losses(self, losses: Dict[str, torch.Tensor]):
        """mmengine's sum of the loss terms, refused when it is not finite.

        The check runs before the optimiser step: a NaN that reached AdamW would poison the
        weights, the moments and, through the EMA, the teacher, and the next checkpoint
        would carry them. Stopping here keeps the last checkpoint good for ``--resume``.
        """
        total, log_vars = super().parse_losses(losses)
        if not torch.isfinite(total):
            terms = ', '.join(f'{name}={float(value):.4g}' for name, value in losses.items())
            iteration = MessageHub.get_current_instance().get_info('iter')
            where = f' at iteration {iteration + 1}' if iteration is not None else ''
            raise FloatingPointError(
                f'Non-finite MST loss{where} ({terms}); training stopped before the update, '
                'so the last checkpoint is intact. Lower the learning rate or check the data, '
                'then continue with --resume.')
        return total, log_vars

    def _mask(self, teacher_feats: MSTFeatures) -> torch.Tensor:
        """The mask rule (Eq. 6) on the teacher's attention; other modes need only the grid."""
        attn = teacher_feats.attn
        if attn is None:
            cls = teacher_feats.global_feat
            attn = cls.new_zeros(cls.shape[0], math.prod(teacher_feats.grid))
        return attention_mask(attn, **self.mask_cfg)

    @staticmethod
    def _same_size_batches(crops: List[torch.Tensor]) -> List[torch.Tensor]:
        """Concatenate consecutive crops of equal size, so each size is one forward pass."""
        return [torch.cat(list(group)) for _, group in groupby(crops, key=lambda c: c.shape)]
