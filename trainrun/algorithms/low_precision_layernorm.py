"""LayerNorm in the autocast dtype (Composer's LowPrecisionLayerNorm).

Under autocast torch runs ``layer_norm`` in fp32 (it is on autocast's fp32 list), so every
LayerNorm of a transformer reads and writes fp32 tensors between bf16/fp16 matmuls. At INIT every
LayerNorm (torch's or timm's) becomes a :class:`LowPrecisionLayerNorm` with the same weights, which, while
autocast is on, casts its input, weight and bias to the autocast dtype and normalises there: half
the memory traffic, an output already in the dtype the next matmul wants. Without autocast
(``precision=fp32``) it is the ordinary LayerNorm. A hand-written subclass because torch has no
switch for one op's autocast policy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainrun.algorithms.base import ModelSurgery
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.models.surgery import replace_children, take_tensors


class LowPrecisionLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed in the autocast dtype while autocast is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(x)
        dtype = torch.get_autocast_dtype(device)
        weight = self.weight.to(dtype) if self.weight is not None else None
        bias = self.bias.to(dtype) if self.bias is not None else None
        with torch.autocast(device, enabled=False):
            return F.layer_norm(x.to(dtype), self.normalized_shape, weight, bias, self.eps)


def plain_layer_norms() -> tuple[type, ...]:
    """The classes that normalise over the last dimensions as ``nn.LayerNorm`` does: torch's, and
    timm's (``timm.layers.LayerNorm``, the same with timm's fast-norm switch). A subclass that
    normalises otherwise (timm's channels-first ``LayerNorm2d``) is not one."""
    from trainrun.models.timm_models import timm_library

    return nn.LayerNorm, timm_library().layers.LayerNorm


def replace_layer_norms(model: nn.Module) -> int:
    """Swap every LayerNorm of ``model`` (:func:`plain_layer_norms`) for a :class:`LowPrecisionLayerNorm`
    with its weights; return how many."""
    plain = plain_layer_norms()

    def low_precision(child: nn.Module) -> nn.Module | None:
        if type(child) not in plain:
            return None
        shape, eps, affine, bias = child.normalized_shape, child.eps, child.elementwise_affine, child.bias is not None
        return take_tensors(LowPrecisionLayerNorm(shape, eps, affine, bias=bias, device="meta"), child)

    return replace_children(model, low_precision)


class LowPrecisionLayerNormAlgorithm(ModelSurgery):
    name = "low_precision_layernorm"
    surgery = staticmethod(lambda model, config: replace_layer_norms(model))
    finds = "LayerNorm"

    def apply(self, event: Event, state: State) -> None:
        if self.operate(state) and state.precision.name == "fp32":
            state.notice("low_precision_layernorm has no effect at precision=fp32 (it acts under autocast)")
