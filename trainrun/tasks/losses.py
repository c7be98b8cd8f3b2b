"""Classification losses that accept class indices or dense (soft) targets, and a cross-entropy
over large vocabularies taken in chunks."""

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


# Logits a chunked cross-entropy takes in float32 at once: 2^25 (128 MB), 256 positions at Llama 3's
# 128,256-token vocabulary, 667 at GPT-2's 50,304.
CHUNK_ELEMENTS = 2**25


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy whose forward writes the logits' gradient (softmax - one-hot, per chunk
    in float32, stored in the logits' dtype) so that the backward only scales it."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        gradient = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        for start in range(0, len(logits), rows):
            part, part_targets = logits[start : start + rows].float(), targets[start : start + rows]
            log_probabilities = part.log_softmax(-1)
            total += F.nll_loss(log_probabilities, part_targets, reduction="sum")
            if gradient is not None:
                probabilities = log_probabilities.exp_()
                probabilities[torch.arange(len(part_targets), device=part.device), part_targets] -= 1
                gradient[start : start + rows] = probabilities
        ctx.gradient = gradient
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        gradient, ctx.gradient = ctx.gradient, None  # once: the buffer becomes the logits' gradient
        return gradient.mul_(grad_output.to(gradient.dtype)), None, None


def summed_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS
) -> torch.Tensor:
    """Summed float32 cross-entropy of ``logits`` (positions, vocabulary), in the logits' own dtype,
    against ``targets`` (positions,), taken a chunk of positions at a time: no float32 copy of the
    whole logits (4 GB for one 8,192-token sequence at 128k tokens) and no float32 log-probabilities
    kept for the backward. Where gradients are recorded the forward writes the logits' gradient as it
    goes (softmax - one-hot: one buffer of the logits' size and dtype, which the backward scales and
    hands on), so nothing is recomputed. Every position is scored (no ignored index: causal LM's).
    float16 logits (``precision=amp``) take the plain path: their gradient, written before the loss
    scale multiplies it, would fall below float16's range. Compiled (a blocks-compiled model's loss:
    :func:`~trainrun.core.compiled.compile_loss`), the plain form is taken: inductor reads the logits
    into float32 inside its kernels and recomputes the softmax in the backward, keeping no float32 copy
    either. Written here because torch has no chunked cross-entropy; Liger's fused linear
    cross-entropy, which goes further (no logits at all), needs Triton and the head inside the loss."""
    rows = max(1, chunk_elements // logits.shape[-1])
    if rows >= len(logits) or logits.dtype == torch.float16 or torch.compiler.is_compiling():  # fp16: gradients
        return F.cross_entropy(logits.float(), targets, reduction="sum")  # below its range before scaling
    return _ChunkedCrossEntropy.apply(logits, targets, rows)
