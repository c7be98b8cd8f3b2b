"""Whole runs through the real CLI: outputs, reproducibility, resume, precision, ranks, packaging."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import TINY, read_metrics, run_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_default_run_reaches_95_percent_within_two_minutes(tmp_path):
    result = run_cli(f"hydra.run.dir={tmp_path / 'run'}", "progress=false", f"data.cache_dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["best_top1"] >= 0.95
    assert summary["time_to_accuracy"]["0.95"]["train_seconds"] < 120
    assert summary["train_seconds"] < 120
    assert "time to accuracy" in result.stdout and "digits (ffcv)" in result.stdout
    assert len(list(tmp_path.glob("digits-*-train.beton"))) == 1  # written once, then reused
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "name: resnet_small" in saved and "${" not in saved


def test_shared_run_outputs(trained_run):
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 2.0
    assert set(summary["time_breakdown"]) >= {"data", "to_device", "step", "eval", "checkpoint"}
    assert summary["train_seconds"] < summary["wall_seconds"]
    checkpoints = sorted(p.name for p in (trained_run / "checkpoints").glob("*.pt"))
    assert checkpoints == ["ep1-ba22.pt", "ep2-ba44.pt"]
    payload = torch.load(trained_run / "checkpoints" / "ep2-ba44.pt", weights_only=True)
    assert payload["progress"]["batch"] == 44


@pytest.mark.slow
def test_same_seed_gives_the_same_loss_curve(trained_run, tmp_path):
    again = tmp_path / "again"
    result = run_cli(*TINY, f"hydra.run.dir={again}", "checkpoint.interval=1ep", "checkpoint.keep=5")
    assert result.returncode == 0, result.stderr
    keys = ("train_loss", "eval_loss", "top1", "top5", "lr")
    assert [{k: r[k] for k in keys} for r in read_metrics(again)] == [
        {k: r[k] for k in keys} for r in read_metrics(trained_run)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_at", ["ep1-ba22.pt", "mid-epoch"])
def test_resume_gives_identical_results(trained_run, tmp_path, checkpoint_at):
    """Stop part-way (at an epoch boundary or mid-epoch), resume=auto, compare with the full run."""
    run_dir = tmp_path / "resumed"
    if checkpoint_at == "mid-epoch":
        first = run_cli(*TINY, f"hydra.run.dir={run_dir}", "checkpoint.interval=30ba")
        assert first.returncode == 0, first.stderr
        (run_dir / "checkpoints" / "ep2-ba44.pt").unlink()  # as if stopped after step 30 of 44
        assert (run_dir / "checkpoints" / "ep1-ba30.pt").is_file()
    else:
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "checkpoints" / checkpoint_at).write_bytes(
            (trained_run / "checkpoints" / checkpoint_at).read_bytes()
        )
    result = run_cli(*TINY, f"hydra.run.dir={run_dir}", "resume=auto")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    original = torch.load(trained_run / "checkpoints" / "ep2-ba44.pt", weights_only=True)["model"]
    resumed = torch.load(run_dir / "checkpoints" / "ep2-ba44.pt", weights_only=True)["model"]
    for key in original:
        assert torch.equal(original[key], resumed[key]), key
    final = read_metrics(run_dir)[-1]
    assert final["top1"] == read_metrics(trained_run)[-1]["top1"] and final["batch"] == 44


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "amp"])
def test_reduced_precision_on_cpu(tmp_path, precision):
    result = run_cli(*TINY, f"precision={precision}", f"hydra.run.dir={tmp_path}", "max_duration=1ep")
    assert result.returncode == 0, result.stderr
    assert ("runs bf16 autocast instead" in result.stdout) == (precision == "amp")


@pytest.mark.slow
def test_flags_algorithms_and_schedules_run_together(tmp_path):
    result = run_cli(
        *TINY,
        "--algorithms",
        "blurpool",
        "channels_last",
        "ema",
        "mixup",
        "cutmix",
        "progressive_resizing",
        "colout",
        "stochastic_depth",
        "label_smoothing",
        "gradient_clipping",
        "--optimizer.lr",
        "0.1",
        "--max_duration",
        "40ba",
        "eval_interval=20ba",
        "scheduler=linear",
        "scheduler.t_warmup=0.1dur",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    assert [r["batch"] for r in read_metrics(tmp_path)] == [20, 40]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_gloo_ranks_share_the_global_batch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        "-m",
        "trainrun",
        *TINY,
        "max_duration=1ep",
        f"hydra.run.dir={tmp_path}",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "2 rank(s)" in result.stdout
    (record,) = read_metrics(tmp_path)
    assert record["batch"] == 22 and record["samples"] == 22 * 64  # global batch 64 = 2 x 32


@pytest.mark.slow
def test_wheel_ships_conf_and_recipes_and_runs_from_anywhere(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("trainrun-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "trainrun/conf/config.yaml" in names and "trainrun/conf/recipe/baseline.yaml" in names
    assert "trainrun/conf/algorithms/ema.yaml" in names
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-m", "trainrun", "--cfg", "job", "recipe=baseline", f"data.path={elsewhere}"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "lr: 2.048" in result.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import trainrun; print(trainrun.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.startswith(str(site))
