"""Sharpness-aware minimisation (Foret et al., 2021), every ``interval``-th step.

On a SAM step the trainer's forward and backward are the first pass: they give g at w, and
under DDP they run with DDP's gradient synchronisation switched off (``require_backward_grad_sync``,
the switch ``no_sync`` flips: each rank's own ascent direction, no all-reduce). At
AFTER_BACKWARD the weights move to w + e, e = ρ·g / (‖g‖ + ε) with ‖·‖ the global norm, the
same batch runs forward and backward again (gradients synchronised), and the weights return to
w; the optimizer then steps with the gradient taken at w + e. Other steps are ordinary steps.
Under fp16 an overflowing first-pass gradient makes e non-finite, and the second forward (in
train mode) would write NaN into the batch-norm running statistics for good: the scaler skips
that step's update, but the statistics are not the optimizer's to skip. On such a step the model's
buffers return to their values after the first pass, chosen on the device (no read-back). On
other steps the second pass updates them as any forward does.

Composer wraps the optimizer in a closure; here the second pass happens at AFTER_BACKWARD,
before the trainer unscales fp16 gradients, so the gradient scaler sees (and checks for
overflow) exactly the gradient that is stepped, and gradient clipping at BEFORE_OPTIMIZER_STEP
clips that gradient too. The loss of the second pass uses the targets the first loss saw
(mixed and smoothed), recorded at AFTER_LOSS.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn.parallel import DistributedDataParallel

from trainrun.algorithms.specs.sam import SAMConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.core.work import StepWork


class SAM(Algorithm):
    name = "sam"
    events = frozenset({Event.BEFORE_FORWARD, Event.AFTER_LOSS, Event.AFTER_BACKWARD})

    def __init__(self, config: SAMConfig) -> None:
        super().__init__(config)
        self._loss_targets = None

    def match(self, event: Event, state: State) -> bool:
        return event in self.events and state.batch % self.config.interval == 0

    def step_work(self, work: StepWork, progress: float) -> StepWork:
        """A second forward and backward of the batch every ``interval``-th step."""
        return dataclasses.replace(work, extra_passes=work.extra_passes + 1 / self.config.interval)

    def apply(self, event: Event, state: State) -> None:
        if event is Event.BEFORE_FORWARD:
            _synchronise_gradients(state, False)
        elif event is Event.AFTER_LOSS:
            self._loss_targets = state.targets
        else:
            _synchronise_gradients(state, True)
            self._second_pass(state)
            self._loss_targets = None

    def _second_pass(self, state: State) -> None:
        """Gradient at w + e, with no value read back to the host.

        An fp16 overflow (non-finite g) is not checked here: e is then non-finite, so is the
        second gradient, which DDP's all-reduce spreads to every rank, and every rank's scaler
        skips the step. The weights return to w by copy, exact whatever e was; the buffers to
        their first-pass values where ‖g‖ was not finite.
        """
        params = [p for p in state.raw_model.parameters() if p.grad is not None]
        scaler = state.precision.scaler
        grads = [p.grad for p in params]
        norm = torch.nn.utils.get_total_norm(grads)  # of the scaled gradient under fp16
        if scaler is not None:
            loss_scale = scaler._get_scale_async()  # the scale tensor itself; get_scale() syncs
            scale = self.config.rho / (norm / loss_scale + self.config.epsilon) / loss_scale
        else:
            scale = self.config.rho / (norm + self.config.epsilon)
        buffers = list(state.raw_model.buffers())
        with torch.no_grad():
            weights = torch._foreach_mul(params, 1.0)  # a copy of w (one foreach kernel), restored after
            saved_buffers = [buffer.clone() for buffer in buffers]
            finite = torch.isfinite(norm)
            torch._foreach_mul_(grads, scale)  # e, in the first-pass gradients' own memory
            torch._foreach_add_(params, grads)
        for param in params:
            param.grad = None
        with state.precision.autocast():
            loss = state.loss_fn(state.model(state.inputs), self._loss_targets)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        with torch.no_grad():
            torch._foreach_copy_(params, weights)
            for buffer, saved in zip(buffers, saved_buffers, strict=True):
                buffer.copy_(torch.where(finite, buffer, saved))


def _synchronise_gradients(state: State, on: bool) -> None:
    """Switch DDP's all-reduce of gradients in the next backward pass on or off."""
    if isinstance(state.model, DistributedDataParallel):
        state.model.require_backward_grad_sync = on
