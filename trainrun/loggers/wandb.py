"""Weights & Biases tracking (``loggers=[wandb]``): a run's config, metrics, time to quality and
summary in the W&B project a team already reads, through the ``wandb`` package.

Rank 0 logs to one W&B run: the composed config (as ``config.yaml`` has it) when the logger is
built; every evaluation's record as ``metrics.jsonl`` has it, the same names, charted against its
``batch``; at the end the time-to-quality table (``time_to_quality``: each target's first record)
and ``summary.json`` as the run's summary. Nothing is logged per step. W&B's console capture is off
(trainrun's console and files already hold it).

Settings (``wandb.*``): ``mode`` (online, offline, disabled; null: ``WANDB_MODE``, else online),
``project``, ``entity``, ``tags``, ``run_name``. Credentials are W&B's own, ``WANDB_API_KEY`` or a
netrc entry: trainrun never reads, passes or writes them. The run's id is kept in
``<run>/wandb.json``: a resumed run continues the same W&B run. Offline runs are written under
``<run>/wandb/`` for ``wandb sync``.

A server that cannot be reached when the run starts, or is lost during it, neither stops nor
holds up training: W&B's start waits at most ``WANDB_INIT_TIMEOUT`` seconds (else
:data:`START_SECONDS`) and its end :data:`FINISH_SECONDS`, its uploads run in its own process
meanwhile, and any error of W&B's makes the run warn once and track nothing more there (its
figures are in ``metrics.jsonl`` and ``summary.json``, which ``trainrun report`` reads).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json, read_json, read_jsonl
from trainrun.core.engine import Callback
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.python_parsing import collector_paused
from trainrun.schema import TrainConfig

RUN_FILE = "wandb.json"  # the W&B run this run logs to, so that a resumed run continues it
START_SECONDS = 30  # W&B's wait for its server at the start (its init_timeout)
FINISH_SECONDS = 60  # and for its uploads at the end (its finish_timeout)
REACHED = ("train_seconds", "wall_seconds", "epoch", "batch", "samples")  # a target's columns


class WandbLogger(Callback):
    """Rank 0's W&B run (module docstring); built by the registry with the run directory and config."""

    def __init__(self, run_dir: Path, config: TrainConfig) -> None:
        self.run_dir = run_dir
        self.settings = config.wandb
        self.run: Any = None
        self.failure: str | None = None  # why W&B tracks nothing more, said once at the next event
        saved = run_dir / RUN_FILE
        previous = read_json(saved) if saved.is_file() else {}
        try:
            self.run = self._start(previous.get("id"), dataclasses.asdict(config))
        except Exception as error:  # noqa: BLE001 - W&B's start fails in many ways; none may end the run
            self.failure = f"W&B could not start a run ({type(error).__name__}: {str(error).splitlines()[0]})"
            return
        atomic_write_json(saved, {"id": self.run.id, "project": self.run.project, "entity": self.run.entity})

    def _start(self, run_id: str | None, config: dict) -> Any:
        with collector_paused():  # its import parses Python (trainrun.python_parsing)
            import wandb

        start = float(os.environ.get("WANDB_INIT_TIMEOUT", START_SECONDS))
        settings = wandb.Settings(console="off", silent=True, init_timeout=start, finish_timeout=FINISH_SECONDS)
        run = wandb.init(
            project=self.settings.project,
            entity=self.settings.entity,
            name=self.settings.run_name or self.run_dir.name,
            tags=list(self.settings.tags) or None,
            mode=self.settings.mode,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            config=config,
            settings=settings,
        )
        run.define_metric("batch")
        run.define_metric("*", step_metric="batch")
        return run

    def run_event(self, event: Event, state: State) -> None:
        if not state.is_main:
            return
        if self.failure is not None:
            state.warn(f"{self.failure}; this run tracks nothing more there: {self._where_instead()}")
            self.failure, self.run = None, None
        if self.run is None:
            return
        try:
            self._track(event, state)
        except Exception as error:  # noqa: BLE001 - as at the start
            self.run = None
            state.warn(f"W&B stopped answering ({type(error).__name__}); this run tracks nothing more there: "
                       f"{self._where_instead()}")  # fmt: skip

    def _where_instead(self) -> str:
        return f"its metrics are in {self.run_dir / run_files.METRICS} and summary.json"

    def _track(self, event: Event, state: State) -> None:
        if event is Event.EVAL_END:  # the record the time-to-quality logger has just written
            self.run.log(read_jsonl(self.run_dir / run_files.METRICS)[-1])
        elif event is Event.FIT_END:
            self._log_outcome()

    def _log_outcome(self) -> None:
        """The time-to-quality table and the summary; then the W&B run ends."""
        import wandb

        summary_path = self.run_dir / run_files.SUMMARY
        summary = read_json(summary_path) if summary_path.is_file() else {}
        rows = [
            [target, *((reached or {}).get(column) for column in REACHED)]
            for target, reached in (summary.get("time_to_accuracy") or {}).items()
        ]
        self.run.log({"time_to_quality": wandb.Table(columns=["target", *REACHED], data=rows)})
        self.run.summary.update(summary)
        self.run.finish()

    def run_failed(self, state: State, error: BaseException) -> None:
        """The W&B run ends as the trainrun run did: killed (Ctrl-C) or failed."""
        if self.run is not None:
            try:
                self.run.finish(exit_code=130 if isinstance(error, KeyboardInterrupt) else 1)
            except Exception:  # noqa: BLE001, S110 - the run's own error is the one to report
                pass
