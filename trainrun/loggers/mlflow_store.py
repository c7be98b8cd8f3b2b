"""MLflow's store as trainrun uses it, without torch: where runs are tracked, one MLflow run
through ``MlflowClient``, and a report's files logged beside the runs it reports.

``trainrun report`` imports this module (it imports no torch); the training callback is
:class:`trainrun.loggers.mlflow.MlflowLogger`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

from trainrun.atomic_io import atomic_write_json, read_json

RUN_FILE = "mlflow.json"  # in the run directory: the MLflow run to continue
BATCH = 100  # parameters or tags per request (MLflow's limit)
QUIET_LOGGERS = ("mlflow.store.db.utils", "alembic")
# MLflow's background queue logs each failed request; a run says once that its store is gone
SILENCED_LOGGERS = ("mlflow.utils.async_logging.async_logging_queue",)


def tracking_uri(configured: str | None, folder: Path) -> str:
    """Where runs in ``folder`` are tracked: the config's store, the environment's, or ``folder/mlflow.db``."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').absolute()}"


# MLflow's HTTP retries, bounded (its defaults: 7 retries, 120 s timeouts, minutes in all): a run's
# requests to a server that is gone give up in about half a minute. The environment's values win.
BOUNDED_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
TRACKING_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")
REACH_SECONDS = 5  # how long the check before a run waits for a tracking server


def check_tracking_store(uri: str) -> str | None:
    """Why runs cannot be tracked at ``uri``, in a few words, or None: a scheme MLflow does not
    track to, a server that does not answer within :data:`REACH_SECONDS`, or a SQLite file whose
    folder cannot be made. Checked before a run starts, so that it never waits on MLflow's retries."""
    import urllib.error
    import urllib.request

    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else "file"
    if scheme not in TRACKING_SCHEMES:
        return f"'{scheme}' is not a store MLflow tracks to (choose from: {', '.join(TRACKING_SCHEMES)})"
    if scheme in ("http", "https"):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=REACH_SECONDS).close()
        except urllib.error.HTTPError:
            return None  # it answered
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            return f"no tracking server answers there within {REACH_SECONDS} s ({reason})"
    if scheme == "sqlite":
        folder = Path(uri.split(":///", 1)[-1]).expanduser().parent
        blocking = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if blocking is not None and not blocking.is_dir():
            return f"its folder cannot be made: '{blocking}' is a file"
    return None


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A config as ``dotted.key: text`` pairs, as MLflow parameters are."""
    if dataclasses.is_dataclass(value):
        value = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat |= flatten(item, f"{prefix}{key}.")
        return flat
    return {prefix[:-1]: str(value)}


class ExperimentRun:
    """One MLflow run in an experiment (made if new), through ``MlflowClient``."""

    def __init__(self, uri: str, experiment: str | None, folder: Path, experiment_id: str | None = None) -> None:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        for name, value in BOUNDED_RETRIES.items():
            os.environ.setdefault(name, value)
        for name in QUIET_LOGGERS:  # a new store's table set-up, said at INFO: not the run's business
            logging.getLogger(name).setLevel(logging.WARNING)
        for name in SILENCED_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id: str | None = None
        self.pending: list[Any] = []  # operations queued to MLflow's background thread
        if experiment_id is not None:
            self.experiment_id = experiment_id
            return
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            local = uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri
            location = (folder / "mlartifacts").absolute().as_uri() if local else None
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
            except MlflowException:  # made meanwhile by another process
                self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            self.experiment_id = found.experiment_id

    def start(self, name: str, params: dict[str, str], tags: dict[str, str]) -> str:
        from mlflow.entities import Param, RunTag

        self.run_id = self.client.create_run(self.experiment_id, run_name=name).info.run_id
        for items, make, key in ((params, Param, "params"), (tags, RunTag, "tags")):
            pairs = [make(k, v) for k, v in items.items()]
            for start in range(0, len(pairs), BATCH):
                self.client.log_batch(self.run_id, **{key: pairs[start : start + BATCH]})
        return self.run_id

    def resume(self, run_id: str) -> None:
        self.run_id = run_id
        self.client.update_run(run_id, status="RUNNING")

    def log_tags(self, tags: dict[str, str]) -> None:
        """Queued to MLflow's background thread, like the metrics."""
        from mlflow.entities import RunTag

        self.pending.append(
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=False)
        )

    def log_metrics(self, metrics: dict[str, float], step: int, synchronous: bool = False) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        entries = [Metric(key, float(value), stamp, step) for key, value in metrics.items() if value is not None]
        operation = self.client.log_batch(self.run_id, metrics=entries, synchronous=synchronous)
        if not synchronous:
            self.pending.append(operation)

    def raise_finished_errors(self) -> None:
        """Raise the error of a queued operation that has failed, without waiting for any other.
        (MLflow's ``RunOperations`` offers only a blocking ``wait``; its futures say whether they are done.)"""
        finished = [op for op in self.pending if all(future.done() for future in op._operation_futures)]
        self.pending = [op for op in self.pending if op not in finished]
        for operation in finished:
            operation.wait()

    def flush(self) -> None:
        """Wait for what was queued (an error in the background raises here)."""
        for operation in self.pending:
            operation.wait()
        self.pending.clear()

    def log_artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))

    def end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


REPORT_FILE = "mlflow-report.json"  # in a report's folder: the MLflow run its files went to


def log_report(run_dirs: list[Path], out: Path, written: list[Path]) -> list[str]:
    """Log a report's files to each experiment its runs were tracked in (one MLflow run named
    ``report``, the same one each time the report in ``out`` is written again); the lines to show."""
    experiments: dict[tuple[str, str], list[str]] = {}
    for run_dir in run_dirs:
        saved = run_dir / RUN_FILE
        if saved.is_file():
            entry = read_json(saved)
            experiments.setdefault((entry["tracking_uri"], entry["experiment_id"]), []).append(entry["run_id"])
    if not experiments:
        return []
    previous_path = out / REPORT_FILE
    previous = (
        {(e["tracking_uri"], e["experiment_id"]): e["run_id"] for e in read_json(previous_path)}
        if (previous_path.is_file())
        else {}
    )
    logged, lines = [], []
    for (uri, experiment_id), run_ids in experiments.items():
        store = ExperimentRun(uri, None, out, experiment_id=experiment_id)
        if (uri, experiment_id) in previous:
            store.resume(previous[uri, experiment_id])
        else:
            store.start("report", {}, {"trainrun.report": str(out.absolute()), "trainrun.runs": ",".join(run_ids)})
        store.log_artifacts(written)
        store.end("FINISHED")
        logged.append({"tracking_uri": uri, "experiment_id": experiment_id, "run_id": store.run_id})
        lines.append(f"logged the report to MLflow run {store.run_id} (experiment {experiment_id}, {uri})")
    atomic_write_json(previous_path, logged)
    return lines
