"""DINODistillHead: Eq. 2 with centring and sharpening, and the centre EMA."""
import pytest
import torch

from mst_mm.models import DINODistillHead


def direct_dino_loss(student, teacher, center, n_crops, t_s, t_t):
    """Eq. 2 written out pair by pair, sample by sample."""
    batch = teacher.shape[0] // 2
    total, pairs = 0.0, 0
    for i in range(2):
        for j in range(n_crops):
            if i == j:
                continue
            for b in range(batch):
                t = teacher[i * batch + b]
                s = student[j * batch + b]
                p_t = torch.exp((t - center[0]) / t_t) / torch.exp((t - center[0]) / t_t).sum()
                p_s = torch.exp(s / t_s) / torch.exp(s / t_s).sum()
                total += float(-(p_t * torch.log(p_s)).sum()) / batch
            pairs += 1
    return total / pairs


def test_loss_matches_direct_formula_and_weight():
    torch.manual_seed(0)
    head = DINODistillHead(out_channels=10, student_temp=0.1, teacher_temp=0.05, loss_weight=0.7)
    head.center.copy_(torch.randn(1, 10) * 0.1)
    center = head.center.clone()
    student, teacher = torch.randn(4 * 3, 10), torch.randn(2 * 3, 10)
    loss = head.loss(student, teacher)
    expected = 0.7 * direct_dino_loss(student, teacher, center, 4, 0.1, 0.05)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


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
