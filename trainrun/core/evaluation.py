"""One evaluation of a rank's share of the evaluation set, for the trainer.

Each batch runs in passes of the training micro-batches' size where one is set, so that an
evaluation's peak stays within the training step's (at 8,192 tokens and a 128k vocabulary one
sequence's float32 logits are 4 GB); batches of whole volumes (lists), which a task's predict
divides itself, run whole. Every rank runs the same passes (a sampler pads the ranks with fewer
samples by repeating one, which under FSDP2 keeps every rank in each pass's weight gathers); the
repeats are left out of the metrics (``DataSpec.eval_samples``, ``Task.without_repeats``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainrun.core.microbatches import microbatch_slices, take

if TYPE_CHECKING:
    from trainrun.core.state import State


def eval_parts(inputs: Any, samples: int, micro_batch: int | None) -> list[slice]:
    """An evaluation batch's passes: ``micro_batch`` samples each for tensor and dict batches, else one."""
    return microbatch_slices(samples, micro_batch if isinstance(inputs, (torch.Tensor, dict)) else None)


def evaluated(state: State, micro_batch: int | None) -> dict[str, float]:
    """The task's metrics over every rank's evaluation samples, each scored once."""
    evaluator = state.task.evaluator(state)
    own = state.data.eval_samples  # this rank's samples left; after them come repeats (None: none)
    for batch in state.data.eval_batches():
        inputs, targets, samples = state.task.batch(batch, state)
        for part in eval_parts(inputs, samples, micro_batch):
            size = part.stop - part.start
            part_inputs, part_targets = take(inputs, part, samples), take(targets, part, samples)
            with state.precision.autocast():
                outputs = state.task.predict(state.model, part_inputs)
            scored = size if own is None else min(size, own)
            if scored == size:
                evaluator.update(outputs, part_targets)
            elif scored > 0:
                evaluator.update(*state.task.without_repeats(outputs, part_targets, scored, size))
            own = None if own is None else own - scored
    return evaluator.compute()
