"""torch's memory trackers as the estimate reads them (:mod:`trainrun.estimate.memory`): the whole
rank's peak alone, and an evaluation's forward tracked without gradients. Written here because
torch's trackers walk every module's peak at each operation, and refuse an evaluation whose forward
passes a view of a weight between modules."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from torch import nn


@functools.cache
def whole_peak_only(tracker: type) -> type:
    """torch's memory ``tracker`` keeping the whole rank's peak alone: at every operation torch's own
    ``_update_peak_stats`` also walks each module the step has entered and copies its snapshot where
    its peak rises (half an 8-GPU BERT-Large estimate's time), and the estimate reads no module's peak."""

    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    def update_peak_stats(self: Any, peak_state: Any) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL_KEY]:
                self._peak_mem[device] = snapshot[_TOTAL_KEY]
                self._peak_mem_snap[device] = dict(snapshot)

    return type(f"WholePeak{tracker.__name__}", (tracker,), {"_update_peak_stats": update_peak_stats})


@functools.cache
def evaluation_tracker(tracker: type) -> type:
    """torch's memory ``tracker`` for an evaluation's forward (:func:`without_gradients`): its weights'
    gradients, which it would hook, are not computed."""

    def track_module_params_and_buffers(self: Any, module: nn.Module, install_grad_hooks: bool = True) -> Any:
        return tracker._track_module_params_and_buffers(self, module, install_grad_hooks=False)

    name = f"Evaluation{tracker.__name__}"
    return type(name, (tracker,), {"_track_module_params_and_buffers": track_module_params_and_buffers})


@contextlib.contextmanager
def without_gradients(model: nn.Module) -> Iterator[None]:
    """``model``'s weights requiring no gradient for an evaluation's forward: under no_grad alone a view
    of a weight (a class token expanded to the batch, PiT's, CaiT's) still requires one, and torch's
    module tracker refuses a module input that does with no gradient function."""
    weights = [weight for weight in model.parameters() if weight.requires_grad]
    for weight in weights:
        weight.requires_grad_(False)
    try:
        yield
    finally:
        for weight in weights:
            weight.requires_grad_(True)
