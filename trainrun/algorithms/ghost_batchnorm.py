"""Ghost batch normalisation (Hoffer et al., 2017): normalise small chunks of the batch.

At INIT every BatchNorm2d becomes a :class:`GhostBatchNorm2d` with the same weights and
statistics. In training, the batch is split into ceil(N / ghost_batch_size) chunks, each
normalised with its own mean and variance; each chunk updates the running statistics with the
momentum divided by the number of chunks, so an epoch moves them as far as plain BN would.
Evaluation is unchanged. No library provides it, so it is written here on ``F.batch_norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainrun.algorithms.base import ModelSurgery
from trainrun.algorithms.specs.ghost_batchnorm import GhostBatchNormConfig
from trainrun.models.surgery import replace_children, take_tensors


class GhostBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d computed over chunks of ``ghost_batch_size`` samples in training."""

    def __init__(self, batchnorm: nn.BatchNorm2d, ghost_batch_size: int) -> None:
        super().__init__(
            batchnorm.num_features,
            batchnorm.eps,
            batchnorm.momentum,
            batchnorm.affine,
            batchnorm.track_running_stats,
            device="meta",
        )
        take_tensors(self, batchnorm)
        self.ghost_batch_size = ghost_batch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or x.shape[0] <= self.ghost_batch_size or self.momentum is None:
            return super().forward(x)
        chunks = x.split(self.ghost_batch_size)  # ceil(N / ghost_batch_size) chunks
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum / len(chunks)
        return torch.cat(
            [
                F.batch_norm(
                    chunk, self.running_mean, self.running_var, self.weight, self.bias, True, momentum, self.eps
                )
                for chunk in chunks
            ]
        )


def apply_ghost_batchnorm(model: nn.Module, config: GhostBatchNormConfig) -> int:
    """Replace every BatchNorm2d in place; return how many were replaced."""
    size = config.ghost_batch_size
    return replace_children(
        model, lambda child: GhostBatchNorm2d(child, size) if type(child) is nn.BatchNorm2d else None
    )


class GhostBatchNorm(ModelSurgery):
    name = "ghost_batchnorm"
    surgery = staticmethod(apply_ghost_batchnorm)
    finds = "BatchNorm2d layers"
