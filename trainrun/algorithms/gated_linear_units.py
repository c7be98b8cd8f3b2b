"""Gated-linear-unit feed-forward layers (Shazeer, 2020): GeGLU for BERT, as Mosaic BERT has them.

A transformer layer's feed-forward block is ``W_o · act(W_i x)``. At INIT every intermediate
module of a Hugging Face encoder (one with a ``dense`` Linear and an ``intermediate_act_fn``:
BERT's, RoBERTa's, ...) becomes ``act(W_g x) ⊙ (W_v x)``, two projections to the same width, one
gated through the model's own activation; the output module (``W_o``, dropout, residual,
LayerNorm) is kept. The width stays ``intermediate_size``, so the block gains a third of its
parameters, as in Composer and Mosaic BERT. The new projections are initialised as the model
initialises Linears (normal, std ``initializer_range``) and have no biases unless asked.
"""

from __future__ import annotations

from torch import nn

from trainrun.algorithms.base import ModelSurgery
from trainrun.algorithms.specs.gated_linear_units import GatedLinearUnitsConfig
from trainrun.models.glu import GatedIntermediate
from trainrun.models.surgery import replace_children


def apply_glu(model: nn.Module, config: GatedLinearUnitsConfig, std: float) -> int:
    """Replace ``model``'s feed-forward intermediates by :class:`GatedIntermediate`, their weights
    drawn with standard deviation ``std``; return how many."""

    def gated(child: nn.Module) -> nn.Module | None:
        dense = getattr(child, "dense", None)
        if not isinstance(dense, nn.Linear) or not hasattr(child, "intermediate_act_fn"):
            return None
        glu = GatedIntermediate(
            dense.in_features,
            dense.out_features,
            child.intermediate_act_fn,
            config.gated_layer_bias,
            config.non_gated_layer_bias,
        )
        for linear in (glu.gated, glu.non_gated):
            nn.init.normal_(linear.weight, std=std)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        return glu.to(dense.weight.device, dense.weight.dtype)

    return replace_children(model, gated)


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
