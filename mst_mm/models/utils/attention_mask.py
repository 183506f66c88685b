"""The MST mask rule (paper Eq. 3 and Eq. 6, Algorithm 1)."""
from typing import Optional

import torch

MASK_MODES = ('attention', 'random', 'none')


def check_mask_args(num: int, p: float, mode: str) -> None:
    """Raise a ValueError that names the bad mask setting and the valid range."""
    if mode not in MASK_MODES:
        raise ValueError(f'Unknown mask mode {mode!r}: choose one of {MASK_MODES}.')
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise ValueError(
            f'Mask `num` must be an integer >= 1 (the lowest 1/num of the patches are '
            f'candidates; the paper uses 8), got {num!r}.')
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(
            f'Mask probability `p` must lie in [0, 1] (the paper uses 0.1), got {p!r}.')


def attention_mask(attn: torch.Tensor,
                   num: int = 8,
                   p: float = 0.1,
                   mode: str = 'attention',
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Choose the patches that the student sees as the [MASK] embedding.

    ``mode='attention'`` is the attention-guided rule of MST (Eq. 6):

    .. math::
        m_i = 1 \iff prob_i < p \ \text{and}\ Attn_i < \tau,

    where :math:`\tau` is the attention of the :math:`\lfloor N/num \rfloor`-th lowest patch
    of the image, so the candidates are the ``N // num`` least attended patches and each is
    masked with probability ``p``. ``mode='random'`` is BERT's rule (Eq. 3):
    :math:`m_i = 1 \iff prob_i < p` for every patch. ``mode='none'`` masks nothing.

    Ties at the threshold are broken by index (``topk``), so exactly ``N // num`` patches
    are candidates.

    Args:
        attn (Tensor): The teacher's CLS-to-patch attention, shape (B, N) (Eq. 5).
            Only its order within each row matters; for ``'random'`` and ``'none'`` only
            its shape and device are used.
        num (int): The lowest ``1/num`` of the patches are candidates. Defaults to 8.
        p (float): The probability that a candidate is masked. Defaults to 0.1.
        mode (str): ``'attention'``, ``'random'`` or ``'none'``.
        generator (torch.Generator, optional): The random source, for reproducible masks.

    Returns:
        BoolTensor: Shape (B, N), True where the patch is masked.
    """
    check_mask_args(num, p, mode)
    if attn.dim() != 2:
        raise ValueError(f'`attn` must have shape (B, N), got {tuple(attn.shape)}.')
    batch, num_patches = attn.shape
    if mode == 'none' or p == 0:
        return torch.zeros(batch, num_patches, dtype=torch.bool, device=attn.device)

    prob = torch.rand(batch, num_patches, generator=generator,
                      device=generator.device if generator is not None else attn.device)
    bernoulli = (prob < p).to(attn.device)
    if mode == 'random':
        return bernoulli

    candidates = torch.zeros(batch, num_patches, dtype=torch.bool, device=attn.device)
    num_candidates = num_patches // num
    if num_candidates > 0:
        lowest = attn.topk(num_candidates, dim=1, largest=False).indices
        candidates.scatter_(1, lowest, True)
    return bernoulli & candidates
