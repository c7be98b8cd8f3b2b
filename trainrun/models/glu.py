"""Gated feed-forward blocks, ``act(gated(x)) * non_gated(x)``: what the gated_linear_units method
puts in place of a transformer layer's first feed-forward projection (Shazeer, 2020; Mosaic BERT's
GeGLU), and where a built model has such projections.

A feed-forward block is found by what it contains, in either of the two forms models are written in:

- a Hugging Face encoder's intermediate (BERT's, RoBERTa's, ViT's...): a ``dense`` Linear with its
  ``intermediate_act_fn``, the output projection in a module of its own;
- a block whose own children are, in order, a widening Linear, a parameterless activation, and a
  Linear back to the input width (timm's ``Mlp`` in ViTs, DeiTs, Swins, Mixers and ConvNeXt-T and
  larger; a user's ``nn.Sequential(Linear, GELU, Linear)``). ConvNeXt-Atto to -Nano write theirs as
  1x1 convolutions, which are not found.

A block that is gated already (Llama's, Qwen3's, ModernBERT's) has neither form and is not found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class GatedIntermediate(nn.Module):
    """``act(gated(x)) * non_gated(x)``: the feed-forward block's first half as a GLU."""

    def __init__(
        self,
        hidden: int,
        width: int,
        activation: Callable[[torch.Tensor], torch.Tensor],
        gated_bias: bool = False,
        non_gated_bias: bool = False,
    ) -> None:
        super().__init__()
        self.gated = nn.Linear(hidden, width, bias=gated_bias)
        self.non_gated = nn.Linear(hidden, width, bias=non_gated_bias)
        self.activation = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.gated(hidden_states)) * self.non_gated(hidden_states)


@dataclass(frozen=True)
class FeedForward:
    """A found feed-forward block: ``block.<projection>`` is the widening Linear, followed by the
    activation ``block.<activation>`` (None where the activation is the block's ``intermediate_act_fn``
    attribute and the block itself is what the GLU replaces)."""

    block: nn.Module
    projection: str
    activation: str | None


def feed_forwards(model: nn.Module) -> list[FeedForward]:
    """Every ungated feed-forward block of ``model`` (module docstring), in module order."""
    found = []
    for module in model.modules():
        if isinstance(module, GatedIntermediate):
            continue
        if isinstance(getattr(module, "dense", None), nn.Linear) and hasattr(module, "intermediate_act_fn"):
            found.append(FeedForward(module, "dense", None))
        elif sequence := _linear_activation_linear(module):
            found.append(FeedForward(module, *sequence))
    return found


def _linear_activation_linear(module: nn.Module) -> tuple[str, str] | None:
    """The names of ``module``'s widening Linear and its activation, where its children are a Linear
    from ``d`` to ``w > d``, then a parameterless leaf that is no dropout nor identity, then a Linear
    from ``w`` to ``d`` (two Linears in all)."""
    children = list(module.named_children())
    linears = [index for index, (_, child) in enumerate(children) if isinstance(child, nn.Linear)]
    if len(linears) != 2:
        return None
    (first_name, first), (_, second) = children[linears[0]], children[linears[1]]
    if not (first.out_features > first.in_features and (second.in_features, second.out_features) == (
            first.out_features, first.in_features)):  # fmt: skip
        return None
    between = children[linears[0] + 1 : linears[1]]
    activations = [name for name, child in between if _is_activation(child)]
    return (first_name, activations[0]) if len(activations) == 1 else None


def _is_activation(module: nn.Module) -> bool:
    return (
        not list(module.children())
        and not list(module.parameters())
        and not isinstance(module, nn.Dropout | nn.Identity | nn.modules.batchnorm._NormBase | nn.LayerNorm)
    )
