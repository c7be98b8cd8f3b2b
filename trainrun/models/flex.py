"""FlexAttention as the models call it: compiled once per process (uncompiled it writes out every
score), or the plain function inside a model that is itself being compiled (dynamo compiles it with
the model, and calling the cached compile there would make dynamo trace the cache)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention


@functools.cache
def _compiled(dynamic: bool) -> Callable[..., torch.Tensor]:
    return torch.compile(flex_attention, dynamic=dynamic)


def flex_kernel(dynamic: bool) -> Callable[..., torch.Tensor]:
    """The FlexAttention to call; ``dynamic``: one compilation for every shape (BERT's packed
    lengths) rather than one per shape (GPT's fixed windows)."""
    return flex_attention if torch.compiler.is_compiling() else _compiled(dynamic)
