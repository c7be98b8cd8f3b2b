"""Classification losses that accept class indices or dense (soft) targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainrun.tasks.base import LossFunction


def dense_targets(targets: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """Class indices as one-hot rows; dense targets unchanged."""
    if targets.dim() == 1:
        return F.one_hot(targets, num_classes).to(dtype)
    return targets.to(dtype)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class indices or probability rows, summed and divided by batch size."""
    if targets.dim() == 1:
        return F.cross_entropy(logits, targets)
    return -(targets * F.log_softmax(logits, dim=1)).sum() / logits.shape[0]


def binary_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One sigmoid per class (BCE-with-logits), summed over classes and divided by batch size.

    Computed in fp32 whatever the autocast dtype: bf16 would round smoothed targets
    (0.92008 becomes 0.921875) and the per-class terms.
    """
    dense = dense_targets(targets, logits.shape[1], torch.float32)
    return F.binary_cross_entropy_with_logits(logits.float(), dense, reduction="sum") / logits.shape[0]


LOSSES: dict[str, LossFunction] = {"soft_ce": soft_cross_entropy, "bce": binary_cross_entropy}
