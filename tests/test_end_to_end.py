"""Whole runs through the real CLI: outputs, reproducibility, resume, precision, ranks, packaging."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import TINY, metrics_without_timing, read_metrics, run_cli, run_here

from trainrun.launch import free_port

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


def test_a_run_records_what_produced_it(trained_run):
    import importlib.metadata

    import trainrun

    provenance = json.loads((trained_run / "summary.json").read_text())["provenance"]
    assert provenance["trainrun"] == trainrun.__version__ and provenance["torch"] == torch.__version__
    assert provenance["command"].startswith("trainrun ") and "hydra.run.dir=" in provenance["command"]
    packages = provenance["packages"]
    assert f"torch=={importlib.metadata.version('torch')}" in packages
    assert f"hydra-core=={importlib.metadata.version('hydra-core')}" in packages
    assert packages == sorted(packages, key=lambda line: line.split("==")[0].lower())


def test_shared_run_outputs(trained_run):
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 2.0
    buckets = {"data", "to_device", "forward", "backward", "optimizer", "algorithms", "eval", "checkpoint", "other"}
    assert set(summary["time_breakdown"]) == buckets
    assert summary["train_seconds"] < summary["wall_seconds"]
    checkpoints = sorted(p.name for p in (trained_run / "checkpoints").glob("*.pt"))
    assert checkpoints == ["ep1-ba22.pt", "ep2-ba44.pt"]
    payload = torch.load(trained_run / "checkpoints" / "ep2-ba44.pt", weights_only=True)
    assert payload["progress"]["batch"] == 44


@pytest.mark.slow
def test_same_seed_gives_the_same_metrics_on_the_torch_path(trained_run, tmp_path):
    """Random crops on; one run loads in the main process, the other in 2 worker processes."""
    again = tmp_path / "again"
    args = ["checkpoint.interval=1ep", "checkpoint.keep=5", "data.num_workers=2"]
    result = run_here(*TINY, f"hydra.run.dir={again}", *args)
    assert result.returncode == 0, result.stderr
    assert metrics_without_timing(again) == metrics_without_timing(trained_run)


@pytest.mark.slow
def test_same_seed_gives_the_same_metrics_on_the_ffcv_path(tmp_path):
    """FFCV's order is seeded and its crops, flips and shifts keyed to (seed, epoch, sample). The
    built-in set's .beton files come from the shared cache (written once, by whichever run is first).
    Both runs in this process: the second runs the pipelines FFCV compiled for the first (14.7 s, then
    5.2 s) and must still draw the same; the default-run test runs FFCV in a process of its own."""
    args = ["data=digits_ffcv", "data.hflip=true", "model.resnet_small.width=8", "max_duration=2ep", "progress=false"]
    for run in ("1", "2"):
        result = run_here(*args, f"hydra.run.dir={tmp_path / run}")
        assert result.returncode == 0, result.stderr
    first = metrics_without_timing(tmp_path / "1")
    assert len(first) == 2 and first == metrics_without_timing(tmp_path / "2")


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_at", ["ep1-ba22.pt", "mid-epoch"])
def test_resume_gives_identical_results(trained_run, tmp_path, checkpoint_at):
    """Stop part-way (at an epoch boundary or mid-epoch), resume=auto, compare with the full run."""
    run_dir = tmp_path / "resumed"
    if checkpoint_at == "mid-epoch":
        first = run_here(*TINY, f"hydra.run.dir={run_dir}", "checkpoint.interval=30ba")
        assert first.returncode == 0, first.stderr
        (run_dir / "checkpoints" / "ep2-ba44.pt").unlink()  # as if stopped after step 30 of 44
        assert (run_dir / "checkpoints" / "ep1-ba30.pt").is_file()
    else:
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "checkpoints" / checkpoint_at).write_bytes(
            (trained_run / "checkpoints" / checkpoint_at).read_bytes()
        )
    result = run_here(*TINY, f"hydra.run.dir={run_dir}", "resume=auto")
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
    result = run_here(*TINY, f"precision={precision}", f"hydra.run.dir={tmp_path}", "max_duration=1ep")
    assert result.returncode == 0, result.stderr
    assert ("runs bf16 autocast instead" in result.stdout) == (precision == "amp")


@pytest.mark.slow
def test_flags_algorithms_and_schedules_run_together(tmp_path):
    result = run_here(
        *TINY,
        "--algorithms",
        "blurpool",
        "channels_last",
        "ema",
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


ALL_TOGETHER = [  # every method but the one of each incompatible pair (cutmix, trivialaugment)
    "blurpool", "channels_last", "label_smoothing", "progressive_resizing", "fixres", "ema", "mixup",
    "sam", "randaugment", "stochastic_depth", "colout", "squeeze_excite", "ghost_batchnorm", "layer_freezing",
    "swa", "selective_backprop", "gradient_clipping",
]  # fmt: skip


@pytest.mark.slow
def test_every_method_together_on_resnet50_at_small_resolution(tmp_path):
    result = run_here(
        "model=resnet50",
        "data=synthetic",
        "data.resolution=32",
        "data.eval_resolution=32",
        "data.num_samples=64",
        "data.val_samples=16",
        "train_batch_size=16",
        "eval_batch_size=16",
        "max_duration=4ba",
        "eval_interval=4ba",
        "progress=false",
        f"algorithms=[{','.join(ALL_TOGETHER)}]",
        "loss=bce",
        "algorithms.fixres.train_resolution=24",
        "algorithms.ghost_batchnorm.ghost_batch_size=4",
        "algorithms.selective_backprop.start=0",
        "algorithms.layer_freezing.freeze_start=0.25",
        "algorithms.swa.swa_start=0.25dur",
        "algorithms.swa.update_interval=1ba",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    assert read_metrics(tmp_path)[-1]["batch"] == 4
    payload = torch.load(tmp_path / "checkpoints" / "ep1-ba4.pt", weights_only=True)
    assert set(payload["algorithms"]) == set(ALL_TOGETHER)


@pytest.mark.slow
def test_ema_and_swa_state_survive_a_resume(tmp_path):
    """Stop mid-way through the SWA window, resume, and get the uninterrupted run's weights and averages."""
    args = [
        *TINY,
        "algorithms=[ema,swa]",
        "algorithms.swa.swa_start=0.5dur",
        "algorithms.swa.swa_end=0.9dur",
        "algorithms.swa.update_interval=4ba",
        "checkpoint.interval=30ba",
        f"hydra.run.dir={tmp_path}",
    ]
    first = run_here(*args)
    assert first.returncode == 0, first.stderr
    final = tmp_path / "checkpoints" / "ep2-ba44.pt"
    uninterrupted = torch.load(final, weights_only=True)
    final.unlink()
    resumed_run = run_here(*args, "resume=auto")
    assert resumed_run.returncode == 0, resumed_run.stderr
    assert "resumed from" in resumed_run.stdout and "ep1-ba30.pt" in resumed_run.stdout
    resumed = torch.load(final, weights_only=True)
    assert resumed["algorithms"]["swa"]["loaded"] and int(resumed["algorithms"]["swa"]["average"]["n_averaged"]) == 5
    for part in ("model",):
        for key, value in uninterrupted[part].items():
            assert torch.equal(value, resumed[part][key]), key
    for name in ("ema", "swa"):
        for key, value in uninterrupted["algorithms"][name]["average"].items():
            assert torch.equal(value, resumed["algorithms"][name]["average"][key]), (name, key)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_gloo_ranks_run_ema_sam_and_blurpool(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "trainrun", *TINY, "algorithms=[ema,sam,blurpool]", "algorithms.sam.interval=2",
        "algorithms.ema.half_life=10ba", "algorithms.ema.update_interval=2ba", f"hydra.run.dir={tmp_path}",
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "2 rank(s)" in result.stdout
    records = read_metrics(tmp_path)
    assert [r["batch"] for r in records] == [22, 44] and records[-1]["top1"] > 0.3  # learns: seeds give 0.42-0.79
    payload = torch.load(tmp_path / "checkpoints" / "ep2-ba44.pt", weights_only=True)
    assert set(payload["algorithms"]) == {"ema", "sam", "blurpool"} and payload["algorithms"]["ema"]


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
        str(free_port()),
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
        [sys.executable, "-m", "trainrun", "--cfg", "job", "recipe=baseline", "data=folder", f"data.path={elsewhere}"],
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


@pytest.mark.slow
def test_stop_at_ends_the_run_at_the_first_evaluation_that_reaches_it(tmp_path):
    """MLPerf's rule: the clock stops at the target; the final checkpoint is written; status says so."""
    args = [*TINY, "max_duration=20ep", "eval_interval=5ba", "stop_at=0.5", f"hydra.run.dir={tmp_path}"]
    result = run_here(*args)
    assert result.returncode == 0, result.stderr
    records = read_metrics(tmp_path)
    assert records[-1]["top1"] >= 0.5 and all(r["top1"] < 0.5 for r in records[:-1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "target_reached" and summary["batches"] == records[-1]["batch"] < 20 * 22
    assert (tmp_path / "checkpoints" / f"ep{records[-1]['batch'] // 22}-ba{records[-1]['batch']}.pt").is_file()
    assert "reached stop_at=0.5: training stops here" in result.stdout


@pytest.mark.slow
def test_a_warmup_longer_than_the_run_is_a_warning_and_one_epoch_has_no_after_first_epoch_line(tmp_path):
    result = run_here(*TINY, "max_duration=1ep", "scheduler.t_warmup=3ep", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "warning: step 0: scheduler.t_warmup=3ep (66 steps) is longer than the whole run" in result.stdout
    assert "(max_duration=1ep, 22 steps)" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["notices"][0]["level"] == "warning"
    assert summary["bottleneck"] is not None and summary["bottleneck_after_first_epoch"] is None
    assert "after the first epoch" not in result.stdout


@pytest.mark.slow
def test_tensorboard_logger_writes_the_runs_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = run_here(*TINY, "--loggers", "tensorboard", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    (events,) = tmp_path.glob("events.out.tfevents.*")
    scalars = EventAccumulator(str(events)).Reload()
    tags = set(scalars.Tags()["scalars"])
    assert {"eval/top1", "eval/top5", "eval/eval_loss", "train/loss", "train/throughput", "train/lr"} <= tags
    assert {"time/forward", "time/data", "time/eval"} <= tags
    records = read_metrics(tmp_path)
    top1 = scalars.Scalars("eval/top1")
    assert [event.step for event in top1] == [r["batch"] for r in records]
    assert [event.value for event in top1] == pytest.approx([r["top1"] for r in records])
    assert [event.step for event in scalars.Scalars("train/lr")] == list(range(10, 45, 10))


@pytest.mark.slow
def test_a_folder_with_unreadable_images_trains_to_the_end_and_lists_them(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for label, name in enumerate(("cat", "dog")):
            folder = tmp_path / "images" / split / name
            folder.mkdir(parents=True)
            for i in range(8):
                Image.new("RGB", (24, 24), (200 * label, 10 * i, 90)).save(folder / f"{i}.jpg")
    bad = tmp_path / "images" / "val" / "dog" / "cmyk_download.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 cut off")
    result = run_cli(  # the warning comes from a loader worker process
        "data=folder", f"data.path={tmp_path / 'images'}", "data.num_classes=2", "model.num_classes=2",
        "data.resolution=16", "data.eval_resolution=16", "data.num_workers=1", "train_batch_size=8",
        "eval_batch_size=8", "max_duration=2ep", "progress=false", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "skipping unreadable image" in line]
    assert len(warnings) == 1 and str(bad) in warnings[0]  # two evaluations, one warning
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["unreadable_files"] == [str(bad)]
