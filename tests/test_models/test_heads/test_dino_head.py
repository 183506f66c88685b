"""DINODistillHead: Eq. 2 with centring and sharpening, and the centre EMA."""
import pytest
import torch

from mst_mm.models import DINODistillHead

K, BATCH = 64, 3


def direct_dino_loss(student, teacher, center, num_crops, t_s, t_t):
    """Eq. 2 written out pair by pair, sample by sample, in float64: the cross-entropy
    H(P_t, P_s) over every (teacher global crop i, student crop j != i) pair."""
    student, teacher, center = student.double(), teacher.double(), center.double()
    batch = teacher.shape[0] // 2
    pairs = []
    for i in range(2):
        for j in range(num_crops):
            if i == j:
                continue
            total = 0.
            for b in range(batch):
                t, s = teacher[i * batch + b], student[j * batch + b]
                p_t = torch.exp((t - center[0]) / t_t) / torch.exp((t - center[0]) / t_t).sum()
                p_s = torch.exp(s / t_s) / torch.exp(s / t_s).sum()
                total = total - (p_t * torch.log(p_s)).sum() / batch
            pairs.append(total)
    return sum(pairs) / len(pairs)


@pytest.mark.parametrize('num_crops', [2, 4, 10])
def test_loss_and_its_gradient_match_eq2_written_out(num_crops):
    gen = torch.Generator().manual_seed(num_crops)
    student = (torch.randn(num_crops * BATCH, K, generator=gen) * 3).requires_grad_()
    teacher = torch.randn(2 * BATCH, K, generator=gen) * 3
    head = DINODistillHead(K, student_temp=0.1, teacher_temp=0.05, loss_weight=0.7)
    head.center.copy_(torch.randn(1, K, generator=gen))
    center = head.center.clone()

    out = head.loss_and_diagnostics(student, teacher)
    expected = 0.7 * direct_dino_loss(student, teacher, center, num_crops, 0.1, 0.05)
    torch.testing.assert_close(out['loss_dino'].double(), expected, rtol=1e-6, atol=0)
    grad, = torch.autograd.grad(out['loss_dino'], student)
    expected_grad, = torch.autograd.grad(expected, student)
    torch.testing.assert_close(grad, expected_grad.float(), rtol=1e-5, atol=1e-9)
    # The logged diagnostics split the cross-entropy: H(P_t, P_s) = H(P_t) + KL(P_t || P_s).
    torch.testing.assert_close((out['teacher_student_kl'] + out['teacher_entropy']).double(),
                               expected.detach() / 0.7, rtol=1e-6, atol=0)


def test_loss_is_computed_in_float32_under_autocast():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(4 * BATCH, K, generator=gen).bfloat16()
    teacher = torch.randn(2 * BATCH, K, generator=gen).bfloat16()
    head = DINODistillHead(K, student_temp=0.1, teacher_temp=0.04)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = head.loss_and_diagnostics(student, teacher)
    assert all(v.dtype == torch.float32 for v in out.values())
    # bfloat16 products would be ~1e-3 off; float32 ones agree with float64 to ~1e-7.
    expected = direct_dino_loss(student, teacher, torch.zeros(1, K), 4, 0.1, 0.04)
    torch.testing.assert_close(out['loss_dino'].double(), expected, rtol=1e-6, atol=0)


def test_center_is_an_ema_of_the_teacher_mean():
    head = DINODistillHead(out_channels=6, center_momentum=0.9)
    teacher = torch.randn(8, 6)
    head.loss(torch.randn(16, 6), teacher)
    torch.testing.assert_close(head.center, 0.1 * teacher.mean(0, keepdim=True))
    teacher2 = torch.randn(8, 6)
    head.loss(torch.randn(16, 6), teacher2)
    expected = 0.9 * 0.1 * teacher.mean(0, keepdim=True) + 0.1 * teacher2.mean(0, keepdim=True)
    torch.testing.assert_close(head.center, expected)


def test_gradient_reaches_student_only():
    head = DINODistillHead(out_channels=6)
    student = torch.randn(8, 6, requires_grad=True)
    teacher = torch.randn(4, 6, requires_grad=True)
    head.loss(student, teacher).backward()
    assert student.grad is not None and teacher.grad is None


def test_negative_weight_is_refused():
    with pytest.raises(ValueError, match='loss_weight'):
        DINODistillHead(out_channels=6, loss_weight=-1)
