"""Gated-linear-unit feed-forward layers (Shazeer, 2020): GeGLU for BERT, as Mosaic BERT has them,
and for any model whose feed-forward blocks are found ungated (``trainrun.models.glu``).

A transformer layer's feed-forward block is ``W_o · act(W_i x)``. At INIT each found block's first
projection and its activation become ``act(W_g x) ⊙ (W_v x)``, two projections to the same width, one
gated through the model's own activation; the output projection (and in an encoder the dropout,
residual and LayerNorm around it) is kept. The width stays the same, so the block gains a third of
its parameters, as in Composer and Mosaic BERT. The new projections are initialised as the model
initialises Linears (normal, std its config's ``initializer_range``, else 0.02) and have no biases
unless asked.
"""

from __future__ import annotations

from torch import nn

from trainrun.algorithms.base import ModelSurgery
from trainrun.algorithms.specs.gated_linear_units import GatedLinearUnitsConfig
from trainrun.models.glu import GatedIntermediate, feed_forwards
from trainrun.models.surgery import replace_children


def apply_glu(model: nn.Module, config: GatedLinearUnitsConfig, std: float) -> int:
    """Make ``model``'s ungated feed-forward blocks gated, the new projections' weights drawn with
    standard deviation ``std``; return how many."""
    blocks = feed_forwards(model)
    replaced: dict[int, nn.Module] = {}
    for found in blocks:
        dense = getattr(found.block, found.projection)
        activation = getattr(found.block, found.activation or "intermediate_act_fn")
        glu = GatedIntermediate(
            dense.in_features, dense.out_features, activation, config.gated_layer_bias, config.non_gated_layer_bias
        )
        for linear in (glu.gated, glu.non_gated):
            nn.init.normal_(linear.weight, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        glu = glu.to(dense.weight.device, dense.weight.dtype)
        if found.activation is None:  # an encoder's intermediate is the block the GLU replaces
            replaced[id(found.block)] = glu
        else:
            setattr(found.block, found.projection, glu)
            setattr(found.block, found.activation, nn.Identity())
    replace_children(model, lambda child: replaced.get(id(child)))
    return len(blocks)


def _apply_glu_as_initialised(model: nn.Module, config: GatedLinearUnitsConfig) -> int:
    return apply_glu(model, config, _initializer_range(model))


class GatedLinearUnits(ModelSurgery):
    name = "gated_linear_units"
    surgery = staticmethod(_apply_glu_as_initialised)
    finds = "transformer feed-forward layers"


def _initializer_range(model: nn.Module) -> float:
    """The std a Hugging Face model initialises Linears with (its config's), else BERT's 0.02."""
    for module in model.modules():
        std = getattr(getattr(module, "config", None), "initializer_range", None)
        if std:
            return std
    return 0.02
