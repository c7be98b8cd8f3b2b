"""Shared helpers: run the real CLI in a subprocess (or, where the process is not what is tested,
in the test's own process) on tiny settings."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch

from trainrun.core.distributed import cores_per_process
from trainrun.data.cache import write_once


def share_the_cores() -> None:
    """Give each pytest-xdist worker, and every process it starts, its share of the cores: two
    workers whose runs each spread torch's threads over every core oversubscribe them, and the
    threads then wait on each other (two 2-epoch MNIST runs side by side on 2 cores: 78 s of
    training each at 2 threads, 4.8 s at 1). A value already set in OMP_NUM_THREADS wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(cores_per_process(workers)))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


share_the_cores()
# numba (FFCV's pipelines, compiled in every process that loads .beton files) without LLVM's
# optimisation passes: the same code, compiled in 14.5 s of CPU instead of 24.6 s a 2-epoch digits
# run on the AVX2-only machine; the tests' data are too small for the optimised loops to matter
os.environ.setdefault("NUMBA_OPT", "0")

# Small enough for a 2-core CPU: a narrow ResNet on digits (torch loader) for two epochs.
TINY = ["data=digits", "model.resnet_small.width=8", "max_duration=2ep", "train_batch_size=64", "progress=false"]
# a run whose numbers one process and two ranks must agree on: group norm (no batch statistics), flips
EXACT = ["data=digits", "data.hflip=true", "model.resnet_small.width=8", "model.resnet_small.norm=group"]
EXACT += ["max_duration=1ep", "train_batch_size=64", "progress=false"]


def on_cpu_beyond_gpus(args: tuple[str, ...] | list[str]) -> list[str]:
    """``args`` with ``device=cpu`` added where they start more ranks than this machine has GPUs
    (trainrun refuses that on CUDA): a test's gloo ranks then run on a GPU machine too."""
    ranks = [value for arg in args for key, _, value in [arg.partition("=")] if key == "launcher.devices"]
    many = ranks and ranks[-1].isdigit() and int(ranks[-1]) > torch.cuda.device_count() > 0
    return [*args, "device=cpu"] if many and not any(arg.startswith("device=") for arg in args) else list(args)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m trainrun ARGS`` with captured text output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "trainrun", *on_cpu_beyond_gpus(args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_here(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``trainrun ARGS`` in this process (in folder ``cwd``), its exit code and output captured as
    :func:`run_cli`'s: for what a command does, not for its process (an interpreter, torch's and
    Hydra's start cost 5-10 s a run on the slower machines). Several ranks are forked from the
    launcher's fork server, which this process keeps between tests: their output goes to the
    server's streams, not here, and they see the environment it started with. Tests that read a
    rank's or a loader worker's output, or set environment for ranks, use :func:`run_cli`."""
    from trainrun.commands import main

    folder = contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext()
    with folder, mock.patch.dict(os.environ, {"COLUMNS": "200"}), captured_output() as (out, err):
        code = main(on_cpu_beyond_gpus(args))
    return subprocess.CompletedProcess(["trainrun", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def captured_output() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """This process's standard output and error, written to the two buffers yielded."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def start_cli(*args: str) -> subprocess.Popen:
    """``python -m trainrun ARGS`` started in the background, its output piped (as :func:`run_cli`'s)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    command = [sys.executable, "-m", "trainrun", *on_cpu_beyond_gpus(args)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition: Callable[[], bool], process: subprocess.Popen, seconds: float = 120) -> None:
    """Poll ``condition`` until it holds, ``process`` ends or ``seconds`` pass; fail if it never held."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert condition(), "the run never got there"


def killed_and_resumed(args: list[str], tmp_path: Path) -> tuple[Path, Path, int]:
    """Train ``args`` whole, and again killed with SIGKILL (no handler runs) after its first
    checkpoint, then resumed with resume=auto; check the resumed run's metrics are the whole run's.
    Returns both run folders and the step the resumed run started from."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert run_here(*args, f"hydra.run.dir={whole}").returncode == 0  # the killed run alone needs a process
    process = start_cli(*args, f"hydra.run.dir={killed}")
    checkpoints = killed / "checkpoints"
    wait_for(lambda: checkpoints.is_dir() and any(checkpoints.glob("*.pt")), process)
    process.kill()
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL  # killed before the end
    newest = max(int(path.stem.split("-ba")[1]) for path in checkpoints.glob("*.pt"))
    resumed = run_here(*args, f"hydra.run.dir={killed}", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr
    assert f"batch {newest}" in resumed.stdout
    assert metrics_without_timing(killed) == metrics_without_timing(whole)
    return whole, killed, newest


def assert_equal_to_summation_order(got: dict, expected: dict) -> None:
    """Two runs' weights equal to float summation order: gloo's reductions sum in an order that
    differs with the ranks and nodes (and DDP's buckets, built anew by a resumed run); SGD, whose
    steps do not divide by the gradients' own size as Adam's do, carries none of that further."""
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=name)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TIMING = ("train_seconds", "wall_seconds", "throughput")


def metrics_without_timing(run_dir: Path) -> list[dict]:
    """What a run learned, evaluation by evaluation: its metrics without the seconds and rates."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_metrics(run_dir)]


def resume_after_step_6(args: list[str], tmp_path: Path) -> tuple[dict, dict]:
    """Train ``args`` (10 steps, a checkpoint every 6) as a whole and again, drop the second run's
    final checkpoint (as if stopped after step 6), resume it; the two final checkpoints, after
    checking that the resumed run's metrics are the whole run's."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    args = [*args, "max_duration=10ba", "checkpoint.interval=6ba", "checkpoint.keep=5", "progress=false"]
    for run_dir in (whole, resumed):  # in this process: resuming from the checkpoint is what is tested
        assert run_here(*args, f"hydra.run.dir={run_dir}").returncode == 0
    final = sorted((resumed / "checkpoints").glob("*.pt"))
    assert [path.name for path in final] == ["ep0-ba10.pt", "ep0-ba6.pt"]
    final[0].unlink()
    result = run_here(*args, f"hydra.run.dir={resumed}", "resume=auto")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    assert metrics_without_timing(resumed) == metrics_without_timing(whole)
    return tuple(torch.load(run / "checkpoints" / "ep0-ba10.pt", weights_only=True) for run in (whole, resumed))


def shared_by_workers(tmp_path_factory, name: str) -> Path:
    """A folder every pytest-xdist worker of this session sees (one worker: its own temporary root)."""
    root = tmp_path_factory.getbasetemp()
    return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / name


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One completed tiny run with a checkpoint every epoch, shared by read-only tests: made once per
    session, by the first worker that needs it (the others wait on the cache's lock, then read it)."""
    run_dir = shared_by_workers(tmp_path_factory, "trained-run")

    def train() -> None:
        result = run_here(*TINY, f"hydra.run.dir={run_dir}", "checkpoint.interval=1ep", "checkpoint.keep=5")
        assert result.returncode == 0, result.stderr

    def finished() -> bool:  # summary.json is written during the run too
        summary = run_dir / "summary.json"
        return summary.is_file() and json.loads(summary.read_text()).get("status") == "completed"

    write_once(run_dir, finished, train)
    return run_dir


def write_decathlon_task(
    root: Path,
    task: str,
    arrays: dict,
    modality: dict[str, str],
    labels: dict[str, str],
    voxel_mm: float | tuple[float, float, float] = 1.0,
    images: str = "imagesTr",
) -> None:
    """A Decathlon-layout task folder at ``root``: each case's image (NIfTI's x, y, z, channel) and
    label of ``arrays`` (name: (image, label)) as ``imagesTr/`` and ``labelsTr/`` NIfTI files (or
    ``imagesTs/`` and ``labelsTs/``) of ``voxel_mm`` voxels (x, y, z), and a ``dataset.json`` naming
    them, the channels (``modality``) and the label values (``labels``)."""
    import nibabel
    import numpy as np

    labels_folder = images.replace("images", "labels")
    (root / images).mkdir(parents=True)
    (root / labels_folder).mkdir()
    sides = voxel_mm if isinstance(voxel_mm, tuple) else (voxel_mm,) * 3
    affine = np.diag([*sides, 1.0])
    for name, (image, label) in arrays.items():
        nibabel.save(nibabel.Nifti1Image(image, affine), root / images / f"{name}.nii.gz")
        nibabel.save(nibabel.Nifti1Image(label, affine), root / labels_folder / f"{name}.nii.gz")
    listed = [{"image": f"./{images}/{name}.nii.gz", "label": f"./{labels_folder}/{name}.nii.gz"} for name in arrays]
    training, test = (listed, []) if images == "imagesTr" else ([], [entry["image"] for entry in listed])
    manifest = {"name": task, "modality": modality, "labels": labels, "training": training, "test": test}
    (root / "dataset.json").write_text(json.dumps(manifest))


def machine_kind() -> str:
    """This machine's processor, its widest vector instructions and its cores: the kind every suite
    time is said with (docs/testing.md)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    vectors = "AVX-512" + (" with bf16" if "avx512_bf16" in flags else "") if "avx512f" in flags else "AVX2 only"
    return f"{model}, {vectors if 'avx2' in flags else 'no AVX2'}, {os.cpu_count()} cores"


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 (pytest's reporter)
    """The machine's kind beside the suite's time, at the end of every run."""
    terminalreporter.write_line(f"machine: {machine_kind()}")
