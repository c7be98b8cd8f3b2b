"""Layer freezing (Composer's variant of FreezeOut, Brock et al., 2017).

At each EPOCH_END (and at FIT_START, so a resumed run freezes the same layers) the frozen
fraction is freeze_level · clip((t − freeze_start) / (1 − freeze_start), 0, 1), t the fraction
of training done. The first int(fraction · L) of the model's L layers with parameters (leaf
modules in definition order) stop training: ``requires_grad`` off and gradients dropped, so the
optimizer skips them and backward stops at the first unfrozen layer. Composer also removes
them from the optimizer's groups; trainrun keeps the groups as they are, so checkpoints of
frozen and unfrozen runs have the same optimizer layout and resume cleanly.

Under ``compile=true`` each new freeze level changes what the compiled graph computes: the
algorithm resets torch.compile's caches then, so the model is recompiled once per change
(with a note on the console) instead of piling up graphs until dynamo's recompile limit
silently sends the rest of the run to eager.
"""

from __future__ import annotations

import torch
from torch import nn

from trainrun.algorithms.specs.layer_freezing import LayerFreezingConfig
from trainrun.core.compiled import is_compiled
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State


def frozen_fraction(progress: float, freeze_start: float, freeze_level: float) -> float:
    """Fraction of layers frozen after ``progress`` of the run."""
    if progress <= freeze_start:
        return 0.0
    return freeze_level * (progress - freeze_start) / (1.0 - freeze_start)  # progress is at most 1


def layers(model: nn.Module) -> list[nn.Module]:
    """Leaf modules that own parameters, in the order the model defines them."""
    return [m for m in model.modules() if not list(m.children()) and next(m.parameters(), None) is not None]


def freeze_leading(model: nn.Module, fraction: float) -> int:
    """Freeze the first ``fraction`` of the model's layers; return how many are frozen."""
    all_layers = layers(model)
    count = int(fraction * len(all_layers))
    for layer in all_layers[:count]:
        for param in layer.parameters():
            param.requires_grad_(False)
            param.grad = None
    return count


class LayerFreezing(Algorithm):
    name = "layer_freezing"
    events = frozenset({Event.INIT, Event.FIT_START, Event.EPOCH_END})

    def __init__(self, config: LayerFreezingConfig) -> None:
        self.config = config
        self._frozen = 0

    def apply(self, event: Event, state: State) -> None:
        if event is Event.INIT:
            state.find_unused_parameters = True  # DDP must not wait for gradients of frozen layers
            return
        fraction = frozen_fraction(state.progress, self.config.freeze_start, self.config.freeze_level)
        frozen = freeze_leading(state.raw_model, fraction)
        if frozen != self._frozen and is_compiled(state.model):
            torch.compiler.reset()
            state.notice(f"layer_freezing: {frozen} layers frozen; torch.compile recompiles the model once")
        self._frozen = frozen
