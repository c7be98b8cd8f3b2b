"""Gradient accumulation: one optimizer step over a batch trained in micro-batches.

Each micro-batch's loss is weighted by its share of the batch, so the accumulated gradient is the
whole batch's mean-loss gradient whatever the split (exactly, for models without batch
statistics). ``auto`` starts from the whole batch and halves the micro-batch whenever a step runs
out of device memory, as Composer's automatic micro-batching does; the step is then retried.

On several ranks a rank that runs out of memory in the middle of DDP's bucketed all-reduce would
leave the others waiting, so while ``auto`` is searching, backward passes run without DDP's
synchronisation, the ranks agree whether any ran out, and gradients are averaged by hand. Once
:attr:`Microbatching.settle_steps` steps ran without running out on inputs no larger than the
largest seen, the micro-batch size has *settled* and DDP synchronises again in the last
micro-batch (its all-reduce overlapping the backward pass, no flattened copy of the gradients,
no agreement round per step). Inputs larger than any seen (progressive resizing, sequence-length
warmup) unsettle it until they too have run that many steps.

:class:`Microbatching` only decides: each step's :class:`StepPlan` (the splits, which pass
synchronises), whether a step that ran out of memory is retried, and smaller by how much. The
trainer runs the passes, in one block (``Trainer._train_step``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from trainrun.core.state import State


def microbatch_slices(batch_size: int, size: int | None) -> list[slice]:
    """Consecutive slices of at most ``size`` samples covering ``batch_size`` (one slice for None)."""
    step = size or batch_size
    return [slice(start, min(start + step, batch_size)) for start in range(0, batch_size, step)]


def take(value: Any, part: slice, batch_size: int) -> Any:
    """The micro-batch ``part`` of a batch value: tensors whose first dimension is the batch are
    sliced, tuples, lists and dicts are sliced element by element, anything else is shared."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
        return value[part]
    if isinstance(value, (tuple, list)):
        return type(value)(take(item, part, batch_size) for item in value)
    if isinstance(value, dict):
        return {key: take(item, part, batch_size) for key, item in value.items()}
    return value


def batch_size_of(inputs: Any) -> int:
    """The number of samples in a batch's inputs (the first tensor's first dimension)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.shape[0]
    items = inputs.values() if isinstance(inputs, dict) else inputs
    return next(batch_size_of(item) for item in items if isinstance(item, (torch.Tensor, tuple, list, dict)))


@dataclass(frozen=True)
class StepPlan:
    """One step's micro-batches and which backward pass synchronises gradients across ranks."""

    parts: list[slice]  # consecutive micro-batches of the batch
    batch_size: int
    by_hand: bool  # no pass synchronises: the gradients are averaged by hand after every rank finished

    def synchronises(self, index: int) -> bool:
        """Whether micro-batch ``index``'s backward pass is the one DDP synchronises in."""
        return index == len(self.parts) - 1 and not self.by_hand


@dataclass
class Microbatching:
    """The micro-batch size of each process (None: the whole batch) and whether ``auto`` may shrink it."""

    size: int | None = None
    auto: bool = False
    settle_steps: int = 20  # steps without running out of memory before ``auto`` counts as settled
    calm_steps: int = 0  # steps since the last out-of-memory or the last larger input
    largest_input: int = 0  # elements of the largest inputs seen

    def settled(self, input_elements: int) -> bool:
        """Whether this step's micro-batches (inputs of ``input_elements``) are known to fit."""
        if input_elements > self.largest_input:
            self.largest_input, self.calm_steps = input_elements, 0
        return self.calm_steps >= self.settle_steps

    def step_fitted(self) -> None:
        """A whole step ran without running out of memory."""
        self.calm_steps += 1

    @classmethod
    def parse(cls, setting: str | None) -> Microbatching:
        """``device_train_microbatch_size``: None, ``auto`` (from the whole batch) or a number."""
        if setting is None or setting == "auto":
            return cls(auto=setting == "auto")
        return cls(int(setting))

    def plan(self, inputs: Any, world_size: int) -> StepPlan:
        """How this step's batch is split and synchronised. Until ``auto``'s size has settled on
        several ranks, DDP does not synchronise and gradients are averaged by hand after every rank
        finished (a rank that runs out of memory inside DDP's all-reduce would leave the others waiting)."""
        batch_size = batch_size_of(inputs)
        by_hand = self.auto and world_size > 1 and not self.settled(input_elements(inputs))
        return StepPlan(microbatch_slices(batch_size, self.size), batch_size, by_hand)

    def may_retry(self, plan: StepPlan, world_size: int) -> bool:
        """Whether a step that ran out of memory is retried smaller: under ``auto``, on one rank, or
        on several until the size settled (after that the other ranks wait in DDP's all-reduce)."""
        return self.auto and (world_size == 1 or plan.by_hand)

    def retry(self, state: State, plan: StepPlan, out_of_memory: bool) -> bool:
        """After an attempt at ``plan``: whether some rank ran out of memory (the ranks agree when
        gradients are averaged by hand), in which case this attempt is dropped and the micro-batch halved."""
        if not any_rank(out_of_memory, state.world_size if plan.by_hand else 1):
            return False
        self._recover(state, plan.batch_size)
        return True

    def _recover(self, state: State, batch_size: int) -> None:
        """After running out of memory on some rank: drop this attempt's gradients, halve, say so."""
        state.optimizer.zero_grad(set_to_none=True)
        state.outputs = state.loss = None
        if state.device.type == "cuda":
            torch.cuda.empty_cache()
        before = self.shrink(batch_size)
        state.notice(
            f"device_train_microbatch_size=auto: out of memory at {before} samples per micro-batch, "
            f"retrying the step with {self.size}"
        )

    def shrink(self, batch_size: int) -> int:
        """Halve the micro-batch after running out of memory in a batch of ``batch_size``; return the
        size that ran out. Gives up at one sample."""
        current = min(self.size or batch_size, batch_size)
        if current <= 1:
            raise torch.OutOfMemoryError("out of memory with micro-batches of one sample")
        self.size = current // 2
        self.calm_steps = 0
        return current


def input_elements(inputs: Any) -> int:
    """How many elements a batch's input tensors hold (shapes only: nothing is read from a device)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.numel()
    if isinstance(inputs, dict):
        inputs = list(inputs.values())
    return sum(input_elements(item) for item in inputs) if isinstance(inputs, (tuple, list)) else 0


def any_rank(flag: bool, world_size: int) -> bool:
    """Whether ``flag`` is true on any rank (every rank gets the same answer).

    The flag travels as a CPU tensor, through the process group's gloo side: reading a device
    tensor back would wait for the device to finish the step, every step.
    """
    if world_size == 1:
        return flag
    value = torch.tensor([float(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def average_gradients(parameters: list[torch.nn.Parameter], world_size: int) -> None:
    """All-reduce and average gradients by hand, one flat buffer per dtype.

    Used after ``auto`` micro-batches ran without DDP's synchronisation: a rank that ran out of
    memory in the middle of a backward pass would leave the others waiting in DDP's bucketed
    all-reduce, so DDP's hooks are off and the ranks first agree whether anyone ran out.
    """
    for param in parameters:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in parameters:
        by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
    for grads in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= world_size
        torch._foreach_copy_(grads, torch._utils._unflatten_dense_tensors(flat, grads))
