"""Timing a config as ``trainrun`` processes training its schedule compressed into a few steps."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from trainrun import run_files
from trainrun.atomic_io import read_json, read_jsonl
from trainrun.children import run_trainrun
from trainrun.config import ConfigSource, override_key, private_folder
from trainrun.core.accounts import train_seconds


@dataclass(frozen=True)
class Profile:
    """What a profiled prefix measured."""

    seconds_per_step: float
    batches_per_epoch: int

    @property
    def seconds_per_epoch(self) -> float:
        return self.seconds_per_step * self.batches_per_epoch


class Profiler:
    """Times configs as ``trainrun`` processes in a scratch folder removed afterwards.

    Each trains its whole schedule compressed into ``steps`` steps (stopping one short of the
    end, which would evaluate), so a method whose step cost changes along the schedule —
    progressive resizing, selective backprop, layer freezing — is timed over all its phases; the
    first step (compilation, loader start) is left out of the average.
    """

    SETS = ("max_duration", "profile_prefix", "scale_schedule_ratio", "eval_interval", "progress", "hydra.run.dir")

    def __init__(self, source: ConfigSource, steps: int) -> None:
        self.source, self.steps = source, steps
        self.folder = private_folder("trainrun-profile-")
        self.count = 0

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __call__(self, overrides: list[str]) -> Profile:
        """The seconds per step of ``overrides``; a failed profile raises naming its error."""
        self.count += 1
        run_dir = self.folder / str(self.count)
        kept = [
            o for o in overrides if override_key(o) not in self.SETS and not override_key(o).startswith("checkpoint.")
        ]
        settings = [f"max_duration={self.steps}ba", f"profile_prefix={self.steps - 1}ba", "scale_schedule_ratio=1"]
        settings += ["eval_interval=1000000000ba", "progress=false", "checkpoint.save_final=false"]
        settings += ["checkpoint.interval=null", f"hydra.run.dir={run_dir}"]
        arguments = [*self.source.flags(), *self.source.overrides([*kept, *settings])]
        result = run_trainrun(arguments, capture_output=True, text=True)
        summary_path = run_dir / run_files.SUMMARY
        if result.returncode != 0 or not summary_path.is_file():
            lines = [line for line in result.stderr.splitlines() if line.strip()] or ["no output"]
            raise ProfileFailed(lines[-1].removeprefix("trainrun: error: "))
        summary = read_json(summary_path)
        first_step = train_seconds(read_jsonl(run_dir / run_files.STEPS)[0])
        per_step = (summary["train_seconds"] - first_step) / max(summary["batches"] - 1, 1)
        return Profile(per_step, summary["batches_per_epoch"])


class ProfileFailed(Exception):
    """A candidate could not be timed here (its one-line error)."""
