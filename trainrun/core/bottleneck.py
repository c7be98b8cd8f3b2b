"""Bottleneck accounting: which resource a run waited on, and what speeding up the rest could gain.

Training time ``T`` (evaluation and checkpoints excluded) splits into three parts:

- **device compute**: forward, backward, optimizer and the algorithms' own work, timed with CUDA
  events on a GPU and by wall clock on a CPU;
- **data loading / CPU augmentation**: the time the loop waited for its next batch and moved it
  to the device. On a GPU only the part of that wait during which the device had nothing else to
  do counts (at most ``T`` minus the device's busy time), because the rest overlapped with compute;
- **host overhead**: everything else (logging, Python between steps, an idle device that was not
  waiting for data).

The largest part is the bottleneck. By Amdahl's law, making everything else free speeds training
up by at most ``T / t_bottleneck``; making the bottleneck itself free, by at most
``T / (T - t_bottleneck)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trainrun.core.accounts import COMPUTE_BUCKETS, INPUT_BUCKETS, UNTIMED_BUCKETS

PART_NAMES = {
    "compute": "device compute",
    "input": "data loading / CPU augmentation",
    "host": "host overhead",
}


@dataclass(frozen=True)
class Bottleneck:
    """The split of training time into compute, input and host, and the Amdahl bounds."""

    clock: str  # "wall" or "cuda events" (how compute was timed)
    train_seconds: float
    compute_seconds: float
    input_seconds: float
    host_seconds: float
    bottleneck: str  # a key of PART_NAMES
    share: float  # the bottleneck's fraction of training time
    speedup_if_rest_free: float | None  # T / t_bottleneck
    speedup_if_bottleneck_free: float | None  # T / (T - t_bottleneck)

    @property
    def sentence(self) -> str:
        """One line for a person: the bottleneck, its share and both Amdahl bounds."""
        parts = ", ".join(
            f"{PART_NAMES[key]} {getattr(self, f'{key}_seconds') / self.train_seconds:.0%}"
            for key in ("compute", "input", "host")
        )
        bound_rest = bound_text(self.speedup_if_rest_free)
        bound_self = bound_text(self.speedup_if_bottleneck_free)
        return (
            f"bottleneck: {PART_NAMES[self.bottleneck]} ({parts} of {self.train_seconds:.1f}s training, "
            f"{self.clock}); speeding up everything else gains at most {bound_rest}, "
            f"removing the bottleneck at most {bound_self}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bottleneck_name": PART_NAMES[self.bottleneck], "sentence": self.sentence}


def find_bottleneck(wall: dict[str, float], device: dict[str, float] | None = None) -> Bottleneck | None:
    """The bottleneck of a run from its wall-clock buckets and, on CUDA, its device buckets."""
    train = sum(seconds for bucket, seconds in wall.items() if bucket not in UNTIMED_BUCKETS)
    if train <= 0:
        return None
    waited = sum(wall.get(bucket, 0.0) for bucket in INPUT_BUCKETS)
    if device:
        compute = min(sum(device.get(bucket, 0.0) for bucket in COMPUTE_BUCKETS), train)
        input_ = min(waited, train - compute)
    else:
        compute = sum(wall.get(bucket, 0.0) for bucket in COMPUTE_BUCKETS)
        input_ = waited
    host = max(train - compute - input_, 0.0)
    parts = {"compute": compute, "input": input_, "host": host}
    name = max(parts, key=parts.get)
    slowest = parts[name]
    return Bottleneck(
        clock="cuda events" if device else "wall clock",
        train_seconds=train,
        compute_seconds=compute,
        input_seconds=input_,
        host_seconds=host,
        bottleneck=name,
        share=slowest / train,
        speedup_if_rest_free=train / slowest if slowest > 0 else None,
        speedup_if_bottleneck_free=train / (train - slowest) if train > slowest else None,
    )


def bound_text(speedup: float | None) -> str:
    """An Amdahl bound as people read it: "1.83x", or "unbounded" when nothing would be left."""
    return "unbounded" if speedup is None else f"{speedup:.2f}x"
