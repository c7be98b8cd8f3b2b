"""loggers=[mlflow]: what a run logs, read back with MlflowClient from the SQLite store and from a
real ``mlflow server`` over HTTP; a resumed run continues its MLflow run; reports log beside runs."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from unittest import mock

import pytest
from conftest import TINY, read_metrics, run_here, start_cli, wait_for

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from trainrun.loggers.mlflow_store import flatten, tracking_uri  # noqa: E402
from trainrun.schema import OptimizerConfig  # noqa: E402

TRACKED = [*TINY, "loggers=[mlflow,tensorboard]", "checkpoint.interval=1ep", "quality_targets=[0.05,0.99]"]


def only_run(client: MlflowClient, experiment: str = "trainrun"):
    found = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([found.experiment_id], filter_string="attributes.run_name != 'report'")
    return run


def test_the_store_is_the_configs_the_environments_or_a_sqlite_file_beside_the_run(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(None, tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri(None, tmp_path) == "http://127.0.0.1:5000"
    assert tracking_uri("sqlite:///x.db", tmp_path) == "sqlite:///x.db"
    flat = flatten({"optimizer": OptimizerConfig(name="adamw"), "loggers": ["mlflow"], "resume": None})
    assert flat["optimizer.name"] == "adamw" and flat["loggers"] == "['mlflow']" and flat["resume"] == "None"
    assert flat["optimizer.lr"] == str(OptimizerConfig().lr)


@pytest.mark.slow
def test_a_run_logs_config_metrics_and_files_and_a_resume_continues_its_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "a"
    first = run_here(*TRACKED, "max_duration=1ep", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr
    assert "mlflow" not in first.stderr.lower()  # the store's set-up is not announced
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    run = only_run(client)
    assert run.info.status == "FINISHED" and run.info.run_name == "a"
    params = run.data.params
    assert params["train_batch_size"] == "64" and params["model.resnet_small.width"] == "8"
    assert params["loggers"] == "['mlflow', 'tensorboard']" and len(params) > 100
    tags = run.data.tags
    assert tags["trainrun.run_dir"] == str(run_dir) and tags["trainrun.devices"] == "1"
    assert tags["trainrun.torch"] and "hydra.run.dir" in tags["trainrun.command"]
    again = run_here(*TRACKED, "max_duration=2ep", f"hydra.run.dir={run_dir}", "resume=auto")
    assert again.returncode == 0 and "resumed from" in again.stdout, again.stderr
    run = only_run(client)  # the same MLflow run, continued
    assert run.info.status == "FINISHED" and run.data.tags["trainrun.resumed_at_step"] == "22"
    history = client.get_metric_history(run.info.run_id, "top1")
    records = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [m.step for m in history] == [22, 44] and len(records) == 2
    for name in ("train_loss", "throughput", "eval_loss", "top5", "epoch"):
        assert len(client.get_metric_history(run.info.run_id, name)) == 2, name
    metrics = run.data.metrics
    assert metrics["summary.batches"] == 44 and metrics["time_to_accuracy.0.05.train_seconds"] > 0
    assert "time_to_accuracy.0.99.train_seconds" not in metrics  # not reached
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json", "metrics.jsonl"} <= artifacts
    local = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id,
        artifact_path="summary.json",
        tracking_uri=client.tracking_uri,
        dst_path=str(tmp_path / "dl"),
    )
    assert open(local).read() == (run_dir / "summary.json").read_text()
    assert list(run_dir.glob("events.out.tfevents.*"))  # tensorboard beside it
    report = run_here("report", str(runs), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    assert "logged the report to MLflow run" in report.stdout
    experiment = client.get_experiment_by_name("trainrun").experiment_id
    (logged,) = client.search_runs([experiment], filter_string="attributes.run_name = 'report'")
    assert {"report.md", "report.csv"} <= {a.path for a in client.list_artifacts(logged.info.run_id)}
    assert logged.data.tags["trainrun.runs"] == run.info.run_id
    assert run_here("report", str(runs), "--out", str(tmp_path / "report")).returncode == 0
    assert len(client.search_runs([experiment], filter_string="attributes.run_name = 'report'")) == 1  # updated


@pytest.mark.slow
def test_a_failed_run_ends_its_mlflow_run_failed(tmp_path):
    result = run_here(*TRACKED, "optimizer.lr=1e30", "max_duration=4ba", f"hydra.run.dir={tmp_path / 'a'}")
    assert result.returncode == 3, result.stderr
    assert only_run(MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")).info.status == "FAILED"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(tmp_path):
    """``mlflow server`` on 127.0.0.1 with its own SQLite store, artifacts proxied; yields (its URI, its process).
    Without MLflow 3's job runner: its seven consumer processes take ~15 s of CPU after the server
    answers, which slowed the run beside them fifty-fold on two cores."""
    port = free_port()
    server_command = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    server = subprocess.Popen(
        [
            server_command, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination", str(tmp_path / "art"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        yield uri, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.mark.slow
def test_a_run_logs_to_a_real_mlflow_server_over_http_and_one_that_loses_it_trains_on(tmp_path):
    """A 1-epoch run logs to a real server through MLFLOW_TRACKING_URI, and the server has its
    metrics and files. Then the server is killed after another run's first evaluation: that run
    trains to its end, exit 0, warns once, keeps every evaluation in metrics.jsonl, and waits on
    no MLflow retries for minutes."""
    with mlflow_server(tmp_path) as (uri, server):
        with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": uri}):  # the run here: the server is tested
            env_run = run_here(
                *TINY,
                "loggers=[mlflow]",
                "max_duration=1ep",
                "mlflow.experiment=team",
                f"hydra.run.dir={tmp_path / 'run'}",
            )
        assert env_run.returncode == 0, env_run.stderr
        client = MlflowClient(uri)
        run = only_run(client, "team")
        assert run.info.status == "FINISHED" and [
            m.step for m in client.get_metric_history(run.info.run_id, "top1")
        ] == [22]
        assert {"config.yaml", "summary.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
        assert not (tmp_path / "mlflow.db").exists()  # nothing in the local default store

        lost_dir = tmp_path / "lost"
        run = start_cli(
            *TINY, "loggers=[mlflow]", "max_duration=3ep", f"mlflow.tracking_uri={uri}", f"hydra.run.dir={lost_dir}"
        )
        wait_for(lambda: (lost_dir / "metrics.jsonl").is_file(), run)
        os.killpg(server.pid, 9)
        killed = time.monotonic()
        out, err = run.communicate(timeout=300)
        after_kill = time.monotonic() - killed
    assert run.returncode == 0, err
    warnings = [line for line in out.splitlines() if "stopped answering" in line]
    assert len(warnings) == 1 and f"MLflow at {uri} stopped answering" in warnings[0]
    assert "mlflow" not in err.lower()  # MLflow's own failure lines are not shown: the warning says it
    summary = json.loads((lost_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(read_metrics(lost_dir)) == 3
    assert after_kill < 120  # two epochs, and no wait on MLflow's retries (its defaults: over 4 minutes)


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("http://127.0.0.1:1", "no tracking server answers there within 5 s"),
        ("ftp://host/store", "'ftp' is not a store MLflow tracks to (choose from: http, https, sqlite,"),
        ("sqlite:///{tmp}/a-file/sub/mlflow.db", "its folder cannot be made: '{tmp}/a-file' is a file"),
    ],
)
def test_a_tracking_store_that_cannot_take_runs_is_refused_before_the_run_in_one_line(tmp_path, uri, why):
    (tmp_path / "a-file").write_text("")
    uri, why = uri.format(tmp=tmp_path), why.format(tmp=tmp_path)
    started = time.monotonic()
    result = run_here(*TINY, "loggers=[mlflow]", f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and time.monotonic() - started < 30
    assert result.stderr.startswith(f"trainrun: error: bad value for 'mlflow.tracking_uri': '{uri}': {why}")
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()
