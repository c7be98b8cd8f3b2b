"""Replace submodules of a model in place, the one operation every model-surgery method needs,
and hand a replacement its original's tensors."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def replace_children(model: nn.Module, replacement: Callable[[nn.Module], nn.Module | None]) -> int:
    """Swap every submodule for ``replacement(submodule)`` where that is not None; return how many.

    Submodules are visited once, in definition order, as they were before any replacement, so a
    replacement that wraps its original is not visited again.
    """
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = replacement(child)
            if new is not None:
                setattr(parent, name, new)
                replaced += 1
    return replaced


def take_tensors(replacement: nn.Module, original: nn.Module) -> nn.Module:
    """``replacement`` (built on the ``meta`` device: nothing allocated) holding ``original``'s own
    parameters and buffers, on their device and in their dtype; return it."""
    replacement.load_state_dict(original.state_dict(), assign=True)
    return replacement
