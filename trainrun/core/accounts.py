"""Where a run's time goes: every second charged to one bucket, per step and in total.

The wall clock always runs: :meth:`TimeAccounts.switch` closes the running bucket and opens
another, so buckets never overlap and add up to the run's wall time. On CUDA the host only
queues kernels, so wall time lands in whichever bucket next waits for the GPU; there the device
buckets are also timed with CUDA events, recorded at every switch and read in batches when the
trainer synchronises anyway (every ``log_interval`` steps). The module imports torch only when a
CUDA clock is made, so that ``trainrun report`` shares its bucket names without loading torch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

BUCKETS = ("data", "to_device", "forward", "backward", "optimizer", "algorithms", "eval", "checkpoint", "other")
UNTIMED_BUCKETS = ("eval", "checkpoint")  # excluded from training time, as the field reports it
COMPUTE_BUCKETS = ("forward", "backward", "optimizer", "algorithms")
INPUT_BUCKETS = ("data", "to_device")
DEVICE_BUCKETS = ("to_device", *COMPUTE_BUCKETS)


def train_seconds(seconds: dict[str, float]) -> float:
    """Training time of per-bucket wall ``seconds`` (the accounts' own, or a ``steps.jsonl`` row):
    evaluation and checkpointing excluded, other keys (``step``, ``device_*``) ignored."""
    return sum(value for bucket, value in seconds.items() if bucket in BUCKETS and bucket not in UNTIMED_BUCKETS)


class CudaEventClock:
    """Device seconds of the device buckets, from CUDA events on the current stream."""

    def __init__(self) -> None:
        import torch

        self._new_event = torch.cuda.Event
        self.seconds = dict.fromkeys(DEVICE_BUCKETS, 0.0)
        self._last: torch.cuda.Event | None = None
        self._pending: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []

    def mark(self, closing: str, step: int) -> None:
        """Record an event where bucket ``closing`` (of ``step``) ends and the next one begins."""
        event = self._new_event(enable_timing=True)
        event.record()
        if self._last is not None and closing in DEVICE_BUCKETS:
            self._pending.append((step, closing, self._last, event))
        self._last = event

    def resolve(self) -> list[tuple[int, str, float]]:
        """Wait for the recorded events; return (step, bucket, seconds) spans and add them up."""
        if not self._pending:
            return []
        self._pending[-1][3].synchronize()
        spans = [(step, bucket, start.elapsed_time(end) / 1000) for step, bucket, start, end in self._pending]
        self._pending.clear()
        for _, bucket, seconds in spans:
            self.seconds[bucket] += seconds
        return spans


class TimeAccounts:
    """Charges every second of a run to exactly one bucket, and each step's seconds to a row.

    A step's row runs from the moment the loop starts waiting for its batch to the moment it
    starts waiting for the next, so evaluation and checkpoints after step ``n`` are in row ``n``.
    Rows are kept only when ``record_steps`` (rank 0, which writes them).
    """

    def __init__(self, device_clock: CudaEventClock | None = None, record_steps: bool = False) -> None:
        self.device_clock = device_clock
        self.record_steps = record_steps
        self.start()

    def start(self, offset: dict[str, Any] | None = None) -> None:
        """Begin timing now, continuing from ``offset`` (a resumed run's :meth:`state_dict`)."""
        offset = offset or {}
        self.seconds = dict.fromkeys(BUCKETS, 0.0) | {k: v for k, v in offset.get("wall", {}).items() if k in BUCKETS}
        if self.device_clock is not None:
            self.device_clock.seconds |= {k: v for k, v in offset.get("device", {}).items() if k in DEVICE_BUCKETS}
        self.current = "other"
        self.step = 0
        self._since = time.perf_counter()
        self._row_start = dict(self.seconds)
        self._rows: list[dict[str, Any]] = []
        self._device_rows: dict[int, dict[str, float]] = {}

    def switch(self, bucket: str) -> str:
        """Charge the time since the last switch to the running bucket; return its name."""
        now = time.perf_counter()
        previous = self.current
        self.seconds[previous] += now - self._since
        if self.device_clock is not None:
            self.device_clock.mark(previous, self.step)
        self.current, self._since = bucket, now
        return previous

    def begin_step(self, step: int, bucket: str) -> None:
        """Close the running step's row and charge what follows to ``bucket`` of ``step``."""
        self.switch(bucket)
        if self.record_steps:
            if self.step > 0:
                row = {bucket: self.seconds[bucket] - self._row_start[bucket] for bucket in BUCKETS}
                self._rows.append({"step": self.step, **row})
            self._row_start = dict(self.seconds)
        self.step = step

    def resolve_device(self) -> None:
        """Read the CUDA events recorded so far (synchronises with the GPU); a no-op on CPU."""
        if self.device_clock is None:
            return
        for step, bucket, seconds in self.device_clock.resolve():
            if self.record_steps:
                row = self._device_rows.setdefault(step, dict.fromkeys(DEVICE_BUCKETS, 0.0))
                row[bucket] += seconds

    def take_rows(self) -> list[dict[str, Any]]:
        """The closed steps' rows since the last call, with device seconds when CUDA-timed."""
        self.resolve_device()
        rows, self._rows = self._rows, []
        if self.device_clock is not None:
            for row in rows:
                device = self._device_rows.pop(row["step"], dict.fromkeys(DEVICE_BUCKETS, 0.0))
                row.update({f"device_{bucket}": seconds for bucket, seconds in device.items()})
        return rows

    @property
    def device_seconds(self) -> dict[str, float] | None:
        """CUDA-event seconds of the device buckets, or None when timed by wall clock only."""
        return dict(self.device_clock.seconds) if self.device_clock is not None else None

    def state_dict(self) -> dict[str, Any]:
        return {"wall": dict(self.seconds), "device": self.device_seconds or {}}

    def total(self) -> float:
        """Wall seconds so far, including the running bucket."""
        return sum(self.seconds.values()) + time.perf_counter() - self._since

    def train_seconds(self) -> float:
        """Wall seconds with evaluation and checkpointing excluded."""
        running = time.perf_counter() - self._since if self.current not in UNTIMED_BUCKETS else 0.0
        return train_seconds(self.seconds) + running
