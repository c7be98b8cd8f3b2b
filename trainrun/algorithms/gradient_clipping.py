"""Gradient clipping before each optimizer step, on gradients already unscaled from fp16.

``norm`` and ``value`` use ``torch.nn.utils``; ``adaptive`` is AGC (Brock et al., 2021), which no
torch utility provides: each output unit's gradient is scaled down to at most
``threshold · max(‖w‖, 1e-3)``, norms taken over all but the first dimension.
"""

import torch

from trainrun.algorithms.specs.gradient_clipping import GradientClippingConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State


def _unit_norms(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() <= 1:
        return tensor.norm().expand_as(tensor)
    dims = tuple(range(1, tensor.dim()))
    return tensor.norm(dim=dims, keepdim=True)


@torch.no_grad()
def adaptive_clip(parameters: list[torch.nn.Parameter], threshold: float, eps: float = 1e-3) -> None:
    """Scale each unit's gradient so that ‖g‖ ≤ threshold · max(‖w‖, eps)."""
    for param in parameters:
        if param.grad is None:
            continue
        max_norm = _unit_norms(param).clamp(min=eps) * threshold
        grad_norm = _unit_norms(param.grad)
        param.grad.mul_(torch.where(grad_norm > max_norm, max_norm / grad_norm.clamp(min=1e-6), 1.0))


class GradientClipping(Algorithm):
    name = "gradient_clipping"
    events = frozenset({Event.BEFORE_OPTIMIZER_STEP})
    config: GradientClippingConfig

    def apply(self, event: Event, state: State) -> None:
        parameters = [p for p in state.model.parameters() if p.grad is not None]
        if self.config.type == "norm":
            torch.nn.utils.clip_grad_norm_(parameters, self.config.threshold)
        elif self.config.type == "value":
            torch.nn.utils.clip_grad_value_(parameters, self.config.threshold)
        else:
            adaptive_clip(parameters, self.config.threshold)
