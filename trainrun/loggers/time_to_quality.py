"""Time-to-accuracy records: one ``metrics.jsonl`` line per evaluation and ``summary.json``.

Accuracy means the task's quality metric, named in every file: records carry each of the
task's metrics under its own name, ``summary.json`` says which is the quality
(``quality_metric``) and gives ``final_<metric>`` and ``best_<quality>``.
``train_seconds`` excludes evaluation and checkpointing, as published time-to-accuracy results
do; ``wall_seconds`` includes everything since training started. A run that trains only a
profiled prefix of its schedule (``profile_prefix``) ends with status ``profiled`` and an
``extrapolated`` block: the full run's training time estimated from the prefix, labelled so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json, atomic_write_text, read_jsonl
from trainrun.core.bottleneck import Bottleneck, find_bottleneck
from trainrun.core.engine import Callback
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.tasks.base import Task


def peak_device_memory(device: torch.device) -> float | None:
    """GB of device memory allocated at the run's peak on this rank (None off a GPU)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 1e9, 3)


class TimeToQualityLogger(Callback):
    """Appends a record per evaluation and keeps when each quality target was first reached."""

    def __init__(
        self,
        run_dir: Path,
        task: Task,
        targets: list[float],
        profile_prefix: int | None = None,
        varying_cost: list[str] | None = None,
        provenance: dict[str, Any] | None = None,
        budget_seconds: float | None = None,
    ) -> None:
        self.metrics_path = run_dir / run_files.METRICS
        self.summary_path = run_dir / run_files.SUMMARY
        self.task, self.quality, self.rule = task, task.quality, task.quality_rule
        self.targets = sorted(targets, reverse=not self.rule.higher_is_better)  # the first reached first
        self.profile_prefix = profile_prefix
        self.varying_cost = varying_cost or []  # algorithms whose step cost changes along the schedule
        self.provenance = provenance or {}  # what made the run: versions, commit, device, command
        self.budget_seconds = budget_seconds
        self.records: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}  # the last summary written
        self._halfway: tuple[int, float] | None = None  # (step, train seconds) halfway through the prefix
        self._first_epoch: dict[str, Any] | None = None  # the time accounts when the first epoch ended

    def resume_from(self, batch: int) -> None:
        """Keep the records up to ``batch`` (a resumed checkpoint); drop any written after it."""
        self.records = [r for r in read_jsonl(self.metrics_path) if r["batch"] <= batch]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in self.records))

    def run_event(self, event: Event, state: State) -> None:
        if event is Event.EVAL_END and state.is_main:
            record = self._record(state)
            self.records.append(record)
            with open(self.metrics_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        elif event is Event.EPOCH_END and state.epoch == 0:
            state.accounts.resolve_device()
            self._first_epoch = state.accounts.state_dict()
        elif event is Event.BATCH_END and self.profile_prefix and state.batch == self.profile_prefix // 2:
            self._halfway = (state.batch, state.accounts.train_seconds())
        elif event is Event.FIT_END and state.is_main:
            profiled = self.profile_prefix is not None and state.batch < state.timeline.max_batches
            self.write_summary(state, state.stop_reason or ("profiled" if profiled else "completed"))

    def _record(self, state: State) -> dict[str, Any]:
        metrics = state.eval_metrics
        return {
            "epoch": state.batch / state.timeline.batches_per_epoch,
            "batch": state.batch,
            "samples": state.samples,
            "train_seconds": round(state.accounts.train_seconds(), 4),
            "wall_seconds": round(state.accounts.total(), 4),
            "throughput": round(metrics["throughput"], 2),
            "lr": state.optimizer.param_groups[0]["lr"],
            "train_loss": _finite_or_none(metrics["train_loss"]),
            "eval_loss": metrics["eval_loss"],
            **{name: metrics[name] for name in self.task.metrics},
            **{name: value for name, value in metrics.items() if "/" in name},  # parts: eval_loss/<corpus>
            **({"lost_seconds": lost_seconds(state.faults)} if state.faults else {}),
        }

    def time_to_targets(self) -> dict[str, dict[str, Any] | None]:
        """For each target, the first record that reached it (train seconds, epoch, batch) or None."""
        reached: dict[str, dict[str, Any] | None] = {}
        for target in self.targets:
            first = next((r for r in self.records if self.rule.reached(r[self.quality], target)), None)
            reached[f"{target:g}"] = (
                {k: first[k] for k in ("train_seconds", "wall_seconds", "epoch", "batch", "samples")} if first else None
            )
        return reached

    def write_summary(self, state: State | None, status: str, error: str | None = None) -> None:
        """Write ``summary.json`` atomically with the outcome of the run."""
        last = self.records[-1] if self.records else {}
        quality = self.quality
        summary = {
            "status": status,
            "error": error,
            "task": self.task.name,
            **self.rule.as_summary(),
            **{f"final_{name}": last.get(name) for name in self.task.metrics},
            f"best_{quality}": self.rule.best(r[quality] for r in self.records),
            "time_to_accuracy": self.time_to_targets(),
            "epochs": state.batch / state.timeline.batches_per_epoch if state else None,
            "batches": state.batch if state else None,
            "samples": state.samples if state else None,
            "train_seconds": state.accounts.train_seconds() if state else None,
            "wall_seconds": state.accounts.total() if state else None,
            "batches_per_epoch": state.timeline.batches_per_epoch if state else None,
            "max_batches": state.timeline.max_batches if state else None,
            "budget_seconds": self.budget_seconds,  # a wall-clock or cost max_duration, in training seconds
            "time_breakdown": dict(state.accounts.seconds) if state else None,
            "device_time_breakdown": state.accounts.device_seconds if state else None,
            "bottleneck": None,
            "bottleneck_after_first_epoch": None,
            "extrapolated": self.extrapolation(state) if status == "profiled" else None,
            "notices": list(state.notices) if state else [],
            # rank 0's peak of allocated device memory (a GPU's; what trainrun estimate predicts)
            "peak_memory_gb": peak_device_memory(state.device) if state else None,
            "unreadable_files": state.unreadable_files if state else [],
            "compile": state.compiled.as_dict() if state and state.compiled else None,
            "faults": state.faults if state else [],  # launcher.fault_tolerance=replicas: nodes lost and joined
            "provenance": self.provenance,
        }
        if state and (bottleneck := find_bottleneck(state.accounts.seconds, state.accounts.device_seconds)):
            summary["bottleneck"] = bottleneck.as_dict()
        if state and self._first_epoch and (steady := self._steady_bottleneck(state)):
            summary["bottleneck_after_first_epoch"] = steady.as_dict()
        atomic_write_json(self.summary_path, summary)
        self.summary = summary

    def _steady_bottleneck(self, state: State) -> Bottleneck | None:
        """The bottleneck of the epochs after the first, which carries one-off compilation and warm-up;
        None when the run trained no step after its first epoch."""
        if state.batch <= state.timeline.batches_per_epoch:
            return None
        first = self._first_epoch
        wall = {k: v - first["wall"].get(k, 0.0) for k, v in state.accounts.seconds.items()}
        device = state.accounts.device_seconds
        if device is not None:
            device = {k: v - first["device"].get(k, 0.0) for k, v in device.items()}
        return find_bottleneck(wall, device)

    def extrapolation(self, state: State) -> dict[str, Any]:
        """The full run's training time from the prefix: its second half's rate for the steps left.

        The prefix's first half (compilation, JIT, cache warm-up) is counted once, as it was
        measured; only steady-state steps are multiplied out.
        """
        measured = state.accounts.train_seconds()
        since_step, since_seconds = self._halfway or (0, 0.0)
        per_step = (measured - since_seconds) / max(state.batch - since_step, 1)
        remaining = state.timeline.max_batches - state.batch
        return {
            "label": "extrapolated",
            "from_batches": state.batch,
            "to_batches": state.timeline.max_batches,
            "measured_train_seconds": measured,
            "seconds_per_step": per_step,
            "train_seconds": measured + remaining * per_step,
            "caveat": (
                f"the step cost varies along the schedule ({', '.join(self.varying_cost)}); the prefix's rate "
                "stands for every remaining step"
                if self.varying_cost
                else None
            ),
        }


def lost_seconds(faults: list[dict[str, Any]]) -> float:
    """Seconds the run's lost nodes cost, each from its last step with the others to the next step
    committed without it (launcher.fault_tolerance=replicas)."""
    return round(sum(fault["seconds"] or 0.0 for fault in faults if fault["event"] == "lost"), 3)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
