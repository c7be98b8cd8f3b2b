"""The FLOPs of the operations whose kernels torch's FLOP counter does not count as a GPU runs them:
fused attention (grouped-query attention at the query's heads; the backward as the model's FLOPs or
as the kernel's work), a grouped convolution's backward, a grouped matrix product (a mixture of
experts' experts, which torch counts not at all). :func:`flop_formulas` is ``FlopCounterMode``'s
``custom_mapping`` for a step's model FLOPs; :func:`kernel_formulas` what an operation's time is of
(:mod:`trainrun.estimate.operations`)."""

from __future__ import annotations

import math
from typing import Any

import torch

aten = torch.ops.aten


def _with_query_heads(shape: torch.Size, heads: int) -> tuple[int, ...]:
    """A key's or value's (batch, heads, tokens, width) widened to the query's heads."""
    batch, _, tokens, width = shape
    return (batch, heads, tokens, width)


def _attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    """An attention kernel's forward FLOPs, grouped-query attention counted at the query's heads
    (the kernel's broadcast of the keys and values)."""
    from torch.utils.flop_counter import sdpa_flop_count

    heads = query_shape[1]
    return sdpa_flop_count(query_shape, _with_query_heads(key_shape, heads), _with_query_heads(value_shape, heads))


def _attention_backward_flops(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    """An attention kernel's backward model FLOPs: twice its forward's (each of the two products'
    gradients with respect to both of its operands), as 6N + 12LDT counts them. torch's formula
    adds the fused kernel's recompute of the scores (2.5x the forward): work the kernel chooses to
    redo, not the model's, as activation checkpointing's recompute is not."""
    return 2 * _attention_flops(query_shape, key_shape, value_shape)


def _convolution_backward_flops(grad_out_shape, x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    """A convolution's backward FLOPs: its forward's for each gradient it computes (the input's, the
    weight's). torch's formula counts the weight's gradient as if the convolution had one group, so
    a grouped one's backward by its groups too much (a depthwise 3 x 3 over 64 channels: 65 times its
    forward, not 2)."""
    transposed, output_mask = args[4], args[7]
    small_side = x_shape if transposed else grad_out_shape  # the positions the forward's GEMM computes
    forward = 2 * small_side[0] * math.prod(small_side[2:]) * math.prod(w_shape)
    return forward * sum(map(bool, output_mask[:2]))


def _grouped_product_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    """A grouped matrix product's (a mixture of experts' experts): twice each output's terms; the
    weights' gradient (two 2-D operands) sums over every group's rows of both."""
    if len(a_shape) == len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * math.prod(out_shape) * a_shape[-1]


def _attention_kernel_backward_flops(grad_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:  # noqa: ANN001
    """What a flash attention kernel's backward computes: its five products (the scores recomputed,
    then the gradients of the probabilities, values, queries and keys) against the forward's two."""
    return 5 * _attention_flops(query_shape, key_shape, value_shape) // 2


# the fused attention kernels: the CPU's flash kernel, which the estimate's fake tensors run, and CUDA's
FUSED_ATTENTION = ("flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention")


def _attention_ops(suffix: str = "") -> list[Any]:
    """The fused attention kernels' aten operations (``suffix`` "_backward": their backwards)."""
    return [getattr(aten, f"_scaled_dot_product_{kernel}{suffix}") for kernel in FUSED_ATTENTION]


def flop_formulas() -> dict:
    """``FlopCounterMode``'s ``custom_mapping`` where torch's own formulas do not count what a GPU's
    kernel computes: the fused attention kernels (:data:`FUSED_ATTENTION`) counted as model FLOPs
    (torch's forward formula; the backward twice the forward) with grouped-query attention's keys and
    values widened to the query's heads (torch 2.11's formulas reject unequal heads; later torch counts
    them so), a grouped convolution's backward, and a grouped matrix product (torch counts none)."""
    return {
        **dict.fromkeys(_attention_ops(), _attention_flops),
        **dict.fromkeys(_attention_ops("_backward"), _attention_backward_flops),
        aten.convolution_backward: _convolution_backward_flops,
        aten._grouped_mm: _grouped_product_flops,
    }


def kernel_formulas() -> dict:
    """:func:`flop_formulas` with the work a fused attention kernel's backward does rather than the
    model's FLOPs it counts (:func:`_attention_kernel_backward_flops`): what an operation's time is of."""
    return flop_formulas() | dict.fromkeys(_attention_ops("_backward"), _attention_kernel_backward_flops)
