"""A linear probe on cached frozen features: multinomial logistic regression, full batch."""
import torch
import torch.nn.functional as F


def linear_probe_top1(train_feats: torch.Tensor, train_labels: torch.Tensor,
                      test_feats: torch.Tensor, test_labels: torch.Tensor,
                      weight_decay: float = 1e-3, steps: int = 200) -> float:
    r"""Top-1 (%) of a softmax classifier trained on frozen features, tested on others.

    The features are standardised with the train statistics, then
    :math:`\min_{W,b} \mathrm{CE}(W x + b, y) + \lambda \|W\|^2` is solved by L-BFGS over
    the whole train set: no augmentation and no learning-rate schedule to tune, so the
    result depends only on the features (and is deterministic). It is the CPU-scale
    counterpart of the config-based probe (``configs/benchmarks/classification``), which
    trains through augmentations for 100 epochs.
    """
    mean, std = train_feats.float().mean(0), train_feats.float().std(0) + 1e-6
    x_train = (train_feats.float() - mean) / std
    x_test = (test_feats.float() - mean) / std
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    linear = torch.nn.Linear(x_train.shape[1], num_classes)
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    optimizer = torch.optim.LBFGS(linear.parameters(), lr=1, max_iter=steps,
                                  history_size=20, line_search_fn='strong_wolfe')

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (F.cross_entropy(linear(x_train), train_labels.long())
                + weight_decay * linear.weight.pow(2).sum())
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    with torch.no_grad():
        predicted = linear(x_test).argmax(1)
    return float((predicted == test_labels.long()).float().mean() * 100)
