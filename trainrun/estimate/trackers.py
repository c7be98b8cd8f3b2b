"""torch's memory trackers as the estimate reads them (:mod:`trainrun.estimate.memory`): the whole
rank's peak alone, and an evaluation's forward tracked without gradients. Written here because
torch's trackers walk every module's peak at each operation, and refuse an evaluation whose forward
passes a view of a weight between modules."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils import _pytree as pytree


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
    """torch's memory ``tracker`` for an evaluation's forward, under no_grad: its module tracker follows
    the forward alone (:func:`forward_only`)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        tracker.__init__(self, *args, **kwargs)
        self._mod_tracker = forward_only(ModTracker)()

    return type(f"Evaluation{tracker.__name__}", (tracker,), {"__init__": __init__})


@functools.cache
def forward_only(tracker: type) -> type:
    """torch's module ``tracker`` (the memory tracker's, the FLOP counter's) for a forward under
    no_grad. It hooks the gradients of a module's inputs and outputs that require one, to follow the
    backward; under no_grad a view of a weight (a class token expanded to the batch: PiT's, CaiT's)
    still requires one but has no gradient function, which the hook refuses. Detached, each is
    followed as a tensor that needs none, its storage the same."""

    def pre_hook(self: Any, module: nn.Module, inputs: Any) -> None:
        return tracker._fw_pre_hook(self, module, _detached(inputs))

    def post_hook(self: Any, module: nn.Module, inputs: Any, outputs: Any) -> None:
        return tracker._fw_post_hook(self, module, _detached(inputs), _detached(outputs))

    return type(f"Forward{tracker.__name__}", (tracker,), {"_fw_pre_hook": pre_hook, "_fw_post_hook": post_hook})


def _detached(values: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, values)
