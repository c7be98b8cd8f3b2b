"""MLflow tracking (``loggers=[mlflow]``): a run's config, provenance, metrics and files in the
experiment a team already reads.

Rank 0 logs to one MLflow run: the flattened config as parameters and the provenance as tags
when the logger is built (before training: the store's start-up is not training time); every
evaluation's metrics with the training loss and throughput of its window, queued to MLflow's own
background thread (``synchronous=False``: the training loop never waits on the store); at the
end the time to each accuracy target and the summary's figures as metrics, ``config.yaml``,
``summary.json`` and ``metrics.jsonl`` as artifacts. Nothing is logged per step.

A store that stops answering during a run (a tracking server restarted or gone) neither stops nor
slows training: MLflow's requests retry a bounded time (:data:`~trainrun.loggers.mlflow_store.BOUNDED_RETRIES`,
in its own thread while training), then the run warns once and tracks nothing more. What was not
tracked is in the run directory's ``metrics.jsonl`` and ``summary.json``, which ``trainrun report`` reads.

Store: ``mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a SQLite file ``mlflow.db`` in
the run directory's parent (its artifacts in ``mlartifacts/`` beside it), so the runs of one
folder (a sweep's, say) share one experiment. The run's id is kept in ``<run>/mlflow.json``: a
resumed run continues the same MLflow run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from mlflow.exceptions import MlflowException

from trainrun import run_files
from trainrun.atomic_io import atomic_write_json, read_json
from trainrun.core.engine import Callback
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.loggers.mlflow_store import RUN_FILE, ExperimentRun, flatten, tracking_uri
from trainrun.schema import TrainConfig

ARTIFACTS = (run_files.CONFIG, run_files.SUMMARY, run_files.METRICS)


class MlflowLogger(Callback):
    """Rank 0's MLflow run (module docstring); built by the registry with the run directory and config."""

    def __init__(self, run_dir: Path, config: TrainConfig) -> None:
        from trainrun.provenance import provenance

        self.run_dir = run_dir
        self.lost = False  # the store stopped answering: track nothing more
        self.uri = tracking_uri(config.mlflow.tracking_uri, run_dir.parent)
        self.store = ExperimentRun(self.uri, config.mlflow.experiment, run_dir.parent)
        saved = run_dir / RUN_FILE
        previous = read_json(saved) if saved.is_file() else None
        if previous and previous.get("tracking_uri") == self.uri:
            self.store.resume(previous["run_id"])
        else:
            facts = provenance(torch.device("cpu"), 0)
            tags = {f"trainrun.{k}": str(v) for k, v in facts.items() if k not in ("packages", "device", "devices")}
            tags |= {"trainrun.run_dir": str(run_dir.absolute()), "mlflow.source.name": "trainrun"}
            name = config.mlflow.run_name or run_dir.name
            run_id = self.store.start(name, flatten(config), tags)
            atomic_write_json(
                saved, {"tracking_uri": self.uri, "experiment_id": self.store.experiment_id, "run_id": run_id}
            )

    def run_event(self, event: Event, state: State) -> None:
        if not state.is_main or self.lost:
            return
        try:
            self._track(event, state)
        except (MlflowException, OSError) as error:  # OSError: requests' connection errors too
            self.lost = True
            state.warn(
                f"MLflow at {self.uri} stopped answering ({type(error).__name__}); this run tracks nothing more "
                f"there: its metrics are in {self.run_dir / run_files.METRICS} and summary.json"
            )

    def _track(self, event: Event, state: State) -> None:
        if event is Event.FIT_START:
            device = torch.cuda.get_device_name(state.device) if state.device.type == "cuda" else "cpu"
            tags = {"trainrun.device": device, "trainrun.devices": str(state.world_size)}
            self.store.log_tags(tags | ({"trainrun.resumed_at_step": str(state.batch)} if state.batch else {}))
        elif event is Event.EVAL_END:
            self.store.raise_finished_errors()  # a store gone since the last evaluation: stop queueing
            metrics = dict(state.eval_metrics)
            metrics["train_loss"], metrics["throughput"] = metrics.pop("train_loss"), metrics.pop("throughput")
            self.store.log_metrics({**metrics, "epoch": state.epoch}, state.batch)
        elif event is Event.FIT_END:
            self._log_outcome(state)

    def _log_outcome(self, state: State) -> None:
        """The summary's figures and time to each target as metrics, the run's files as artifacts."""
        summary_path = self.run_dir / run_files.SUMMARY
        summary = read_json(summary_path) if summary_path.is_file() else {}
        figures = {
            f"summary.{k}": v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for target, reached in (summary.get("time_to_accuracy") or {}).items():
            if reached:  # the first evaluation at or past the target
                figures[f"time_to_accuracy.{target}.train_seconds"] = reached.get("train_seconds")
        self.store.flush()
        self.store.log_metrics(figures, state.batch, synchronous=True)
        self.store.log_artifacts([self.run_dir / name for name in ARTIFACTS])
        self.store.end("FINISHED")

    def run_failed(self, state: State, error: BaseException) -> None:
        """The MLflow run ends as the trainrun run did: killed (Ctrl-C) or failed."""
        if self.lost:
            return
        self.store.flush()
        self.store.log_artifacts([self.run_dir / name for name in ARTIFACTS])
        self.store.end("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
