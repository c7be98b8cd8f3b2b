"""``steps.jsonl``: the seconds of every training step, bucket by bucket.

Each line is one optimizer step: waiting for data, moving it to the device, forward, backward,
optimizer, the algorithms' own work, and the evaluation or checkpoint that followed it. On CUDA
the device buckets are repeated as ``device_*`` from CUDA events. Lines are appended every
``log_interval`` steps, when the trainer has synchronised anyway.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainrun import run_files
from trainrun.atomic_io import atomic_write_text, read_jsonl
from trainrun.core.engine import Callback
from trainrun.core.events import Event
from trainrun.core.state import State


class StepTimeLogger(Callback):
    """Rank 0 appends the closed steps' rows of ``state.accounts`` to ``steps.jsonl``."""

    def __init__(self, run_dir: Path, interval: int) -> None:
        self.path = run_dir / run_files.STEPS
        self.interval = interval

    def resume_from(self, batch: int) -> None:
        """Keep the rows up to ``batch`` (a resumed checkpoint); drop any written after it."""
        rows = [row for row in read_jsonl(self.path) if row["step"] <= batch]
        atomic_write_text(self.path, "".join(json.dumps(row) + "\n" for row in rows))

    def run_event(self, event: Event, state: State) -> None:
        if not state.is_main:
            return
        if event is Event.FIT_START and not self.path.exists():
            self.path.touch()
        elif (event is Event.BATCH_END and state.batch % self.interval == 0) or event is Event.FIT_END:
            self._append(state)

    def _append(self, state: State) -> None:
        rows = state.accounts.take_rows()
        if rows:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.writelines(json.dumps({k: _rounded(v) for k, v in row.items()}) + "\n" for row in rows)


def _rounded(value: float | int) -> float | int:
    return round(value, 6) if isinstance(value, float) else value
