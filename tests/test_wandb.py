"""``loggers=[wandb]``: an offline W&B run read back from the file W&B writes (its config, every
evaluation's record as metrics.jsonl has it, the time-to-quality table, the summary), continued by a
resumed run, never holding a credential; a server that cannot be reached costs one warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import read_metrics, run_cli, run_here

from trainrun.loggers import wandb as wandb_logger

pytestmark = pytest.mark.slow  # runs that train, one in a process of its own

RUN = ["data=digits", "model.resnet_small.width=8", "train_batch_size=64", "progress=false", "loggers=[wandb]"]
SECRET = "0123456789abcdef0123456789abcdef01234567"  # a W&B API key's shape: 40 characters
BLOCK = 32768  # the block of the log W&B writes (LevelDB's log format, after W&B's own 7-byte header)


def wandb_records(run_dir: Path) -> list:
    """Every record of the W&B run files under ``run_dir/wandb/`` (W&B's protobuf ``Record``s, in
    order; a resumed run's files after the first's)."""
    from wandb.proto.wandb_internal_pb2 import Record

    records = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, offset, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while offset + 7 <= len(data):
            if BLOCK - offset % BLOCK < 7:  # a block's tail too short for a header: padding
                offset += BLOCK - offset % BLOCK
                continue
            length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
            if kind == 0:  # zeros to the block's end
                offset += BLOCK - offset % BLOCK
                continue
            pending += data[offset + 7 : offset + 7 + length]
            offset += 7 + length
            if kind in (1, 4):  # a whole record, or a record's last part
                records.append(Record.FromString(pending))
                pending = b""
    return records


def values(items) -> dict:  # noqa: ANN001 - W&B's repeated items
    """W&B's items (a key, or a path of keys, and a JSON value) as a nested dict."""
    found: dict = {}
    for item in items:
        *outer, last = [item.key] if item.key else list(item.nested_key)
        place = found
        for key in outer:
            place = place.setdefault(key, {})
        place[last] = json.loads(item.value_json)
    return found


def history(records: list) -> list[dict]:
    """The rows the run logged, without W&B's own keys (``_step``, ``_runtime``, ``_timestamp``)."""
    rows = [values(r.history.item) for r in records if r.HasField("history")]
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def test_an_offline_run_holds_the_config_every_record_the_table_and_the_summary_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    run_dir = tmp_path / "run"
    args = [*RUN, "max_duration=10ba", "eval_interval=5ba", "checkpoint.interval=6ba", "checkpoint.keep=5"]
    args += ["wandb.project=digits", "wandb.tags=[smoke,cpu]", f"hydra.run.dir={run_dir}"]
    assert run_here(*args).returncode == 0
    records = wandb_records(run_dir)
    (started,) = [r.run for r in records if r.HasField("run")]
    assert started.project == "digits" and list(started.tags) == ["smoke", "cpu"] and started.display_name == "run"
    config = values(started.config.update)
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert {key: config[key] for key in written} == json.loads(json.dumps(written))  # the composed config
    rows = history(records)
    assert [row for row in rows if "time_to_quality" not in row] == read_metrics(run_dir)  # names, values, batches
    (table,) = [row["time_to_quality"] for row in rows if "time_to_quality" in row]
    assert table["_type"] == "table-file" and table["nrows"] == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    logged = {
        item.key: json.loads(item.value_json) for r in records if r.HasField("summary") for item in r.summary.update
    }
    final = f"final_{summary['quality_metric']}"
    assert logged[final] == summary[final] and logged["status"] == "completed"
    assert logged["time_to_accuracy"] == summary["time_to_accuracy"]
    first_id = json.loads((run_dir / wandb_logger.RUN_FILE).read_text())["id"]
    assert started.run_id == first_id
    # resumed from step 6: the same W&B run, its records from step 10 again
    (run_dir / "checkpoints" / "ep0-ba10.pt").unlink()
    assert run_here(*args, "resume=auto").returncode == 0
    assert json.loads((run_dir / wandb_logger.RUN_FILE).read_text())["id"] == first_id
    runs = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 2 and all(path.name.endswith(first_id) for path in runs)
    assert [row["batch"] for row in history(wandb_records(run_dir)) if "time_to_quality" not in row] == [5, 10, 10]
    for path in run_dir.rglob("*"):  # no credential in any file the run wrote, W&B's own included
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def test_a_server_that_cannot_be_reached_costs_one_warning_and_the_run_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    result = run_cli(*RUN, "max_duration=1ep", f"hydra.run.dir={tmp_path}")  # a process: W&B's own state is fresh
    assert result.returncode == 0, result.stderr
    said = [line for line in (result.stdout + result.stderr).splitlines() if "tracks nothing more" in line]
    assert len(said) == 1 and "W&B could not start a run" in said[0], result.stdout + result.stderr
    assert read_metrics(tmp_path) and json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("mode", ["sometimes"])
def test_a_mode_w_and_b_does_not_know_is_refused_in_one_line(mode, tmp_path):
    result = run_here(*RUN, f"wandb.mode={mode}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "wandb.mode" in result.stderr and not (tmp_path / "run").exists()
