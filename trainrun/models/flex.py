"""FlexAttention as the models call it: compiled once per process (uncompiled it writes out every
score), or the plain function inside a model that is itself being compiled (dynamo compiles it with
the model, and calling the cached compile there would make dynamo trace the cache), or on the CPU.
Under :func:`as_fused_kernel` (the estimate's record of a step's operations) it is its fused
kernel's work instead: the CPU's eager FlexAttention writes out every score, which no GPU does."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

_AS_FUSED = contextvars.ContextVar("flex_as_fused_kernel", default=False)
CAUSAL_SHARE = 0.5  # of the keys a causal mask attends, where a block mask's own share cannot be read


@functools.cache
def _compiled(dynamic: bool) -> Callable[..., torch.Tensor]:
    return torch.compile(flex_attention, dynamic=dynamic)


def flex_kernel(dynamic: bool, compiled: bool = True) -> Callable[..., torch.Tensor]:
    """The FlexAttention to call; ``dynamic``: one compilation for every shape (BERT's packed
    lengths) rather than one per shape (GPT's fixed windows); ``compiled`` false: the plain function
    (the CPU's)."""
    if _AS_FUSED.get():
        return fused_kernel_work
    return flex_attention if not compiled or torch.compiler.is_compiling() else _compiled(dynamic)


def attends_through_flex(tensor: torch.Tensor) -> bool:
    """Whether a model whose masks FlexAttention runs attends through it: on a GPU, and in the
    estimate's record of a GPU's step (:func:`as_fused_kernel`), which times its fused kernel."""
    return tensor.is_cuda or _AS_FUSED.get()


@contextlib.contextmanager
def as_fused_kernel() -> Iterator[None]:
    """FlexAttention as :func:`fused_kernel_work` while inside."""
    token = _AS_FUSED.set(True)
    try:
        yield
    finally:
        _AS_FUSED.reset(token)


def fused_kernel_work(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_mod=None, block_mask=None, **_):  # noqa: ANN001, ANN202
    """The work of FlexAttention's fused kernel: one fused attention over the share of the keys its
    block mask attends (its blocks skipped, as the kernel skips them), the outputs' shapes its own.
    A mask whose blocks are fake tensors (built inside the estimate's fake pass) is read as causal."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    try:
        share = 1 - block_mask.sparsity() / 100 if block_mask is not None else 1.0
    except DataDependentOutputException:  # the mask's block counts are fake: no values to read
        share = CAUSAL_SHARE
    keys = max(1, round(k.shape[-2] * share))
    heads = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k[..., :keys, :], v[..., :keys, :], enable_gqa=heads)
