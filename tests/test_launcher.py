"""The runner: worker processes through torch's elastic launcher, failures, ports, Slurm, Ctrl-C."""

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import EXACT, on_cpu_beyond_gpus, read_metrics, run_cli, run_here
from hydra import compose, initialize_config_dir

from trainrun import launch
from trainrun.config import register_schema
from trainrun.core.distributed import check_gpus_for, nodes_from_environment
from trainrun.errors import ConfigError
from trainrun.launch import LaunchFailed, adopt_slurm_environment, run_workers, tasks_per_node
from trainrun.network import first_host
from trainrun.schema import LauncherConfig

CONF = Path(__file__).resolve().parent.parent / "conf"


def rank_one_fails() -> None:
    """Rank 1 raises at once; rank 0 would otherwise wait far beyond the test's limit."""
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 fails on purpose")
    time.sleep(300)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_train_what_one_process_trains(tmp_path):
    """Same global batch and seed on 1 and 2 gloo ranks, random crops and flips on: losses and
    weights agree to 1e-5.

    Each sample's augmentation is keyed to (seed, epoch, sample) and group norm is per sample, so
    the step does not depend on how the batch is split; the rest is float summation order.
    """
    one, two = tmp_path / "one", tmp_path / "two"
    assert run_cli(*EXACT, f"hydra.run.dir={one}").returncode == 0
    result = run_cli(*EXACT, "launcher.devices=2", f"hydra.run.dir={two}")
    assert result.returncode == 0, result.stderr
    assert "2 rank(s)" in result.stdout and result.stdout.count("run dir") == 1  # only rank 0 prints
    (first,), (second,) = read_metrics(one), read_metrics(two)
    assert second["train_loss"] == pytest.approx(first["train_loss"], abs=1e-5)
    assert second["top1"] == pytest.approx(first["top1"], abs=1e-3)
    a = torch.load(one / "checkpoints" / "ep1-ba22.pt", weights_only=True)["model"]
    b = torch.load(two / "checkpoints" / "ep1-ba22.pt", weights_only=True)["model"]
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), atol=1e-5), key
    assert sorted(p.name for p in two.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "model.safetensors",  # the final weights, exported once, by rank 0
        "steps.jsonl",
        "summary.json",
    ]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_stops_every_rank_within_30_seconds():
    started = time.monotonic()
    with pytest.raises(LaunchFailed, match="rank 1 failed") as failure:
        run_workers(LauncherConfig(), 2, rank_one_fails)
    assert time.monotonic() - started < 30
    assert failure.value.exit_code != 0


def never_runs() -> None:
    raise AssertionError("no rank starts without its rendezvous")


def test_a_node_whose_master_never_comes_ends_in_one_line_within_the_rendezvous_timeout():
    """Node 1 of two, nobody listening at node 0's address: it ends after launcher.rendezvous_timeout
    seconds naming the rendezvous, not when it is killed, and torch's store client never retries (and
    prints its traces)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings = LauncherConfig(devices="1", nnodes=2, node_rank=1, master_port=port, rendezvous_timeout=5)
    started = time.monotonic()
    with pytest.raises(LaunchFailed) as failure:
        run_workers(settings, 1, never_runs)
    assert 5 <= time.monotonic() - started < 20 and failure.value.exit_code == 1
    assert str(failure.value) == (
        f"node 1 found no rendezvous at 127.0.0.1:{port} within launcher.rendezvous_timeout=5 s: "
        "is node 0 up there, and reachable?"
    )


@pytest.mark.distributed
def test_a_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(*EXACT, "launcher.devices=2", f"launcher.master_port={port}", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"trainrun: error: bad value for 'launcher.master_port': port {port} is already in use on this machine "
        "(choose another, or leave it unset for a free one on a single node)"
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_stops_all_ranks_and_keeps_the_last_checkpoint(tmp_path):
    command = [sys.executable, "-m", "trainrun", *EXACT, "max_duration=200ep", "checkpoint.interval=5ba"]
    command = [*on_cpu_beyond_gpus([*command, "launcher.devices=2"]), f"hydra.run.dir={tmp_path}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    checkpoints = tmp_path / "checkpoints"
    deadline = time.monotonic() + 120
    while not (checkpoints.is_dir() and any(checkpoints.glob("*.pt"))) and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    try:
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, process.stderr.read().decode()
    for path in checkpoints.glob("*.pt"):
        assert torch.load(path, weights_only=True)["format"] == "trainrun/1"
    assert not list(checkpoints.glob("*.partial*"))


def test_a_torch_without_a_shutdown_setting_still_launches(monkeypatch):
    """torch 2.11's LaunchConfig has no ``shutdown_timeout``: passing it stopped every run of two ranks."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(launch.LaunchConfig) if f.name != "shutdown_timeout"]
    monkeypatch.setattr(launch, "LaunchConfig", dataclasses.make_dataclass("LaunchConfig", fields))
    settings = LauncherConfig(rdzv_endpoint="localhost:29400")  # no port to check
    assert launch.launch_config(settings, 2).nproc_per_node == 2
    monkeypatch.undo()
    if "shutdown_timeout" in {field.name for field in dataclasses.fields(launch.LaunchConfig)}:  # torch 2.12 on
        assert launch.launch_config(settings, 2).shutdown_timeout == launch.SHUTDOWN_SECONDS


def test_slurm_node_lists_and_environment(monkeypatch):
    assert first_host("gpu[07-09,12],cpu3") == "gpu07"
    assert first_host("node12") == "node12"
    assert first_host("a-b[3,5]") == "a-b3"
    torch_names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    for key in (*torch_names, "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"):
        monkeypatch.setenv(key, "")  # recorded, so whatever adopt_slurm_environment sets is undone after
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert not adopt_slurm_environment(LauncherConfig())  # one task: trainrun launches its own workers
    monkeypatch.delenv("SLURM_STEP_NODELIST", raising=False)
    env = {"SLURM_STEP_NUM_TASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    env |= {"SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}
    for key, value in {**env, "SLURM_JOB_ID": "4242"}.items():
        monkeypatch.setenv(key, value)
    assert adopt_slurm_environment(LauncherConfig())
    assert [os.environ[k] for k in torch_names] == ["9", "16", "1", "gpu07", str(20000 + 4242)]
    # the node's place and size as torchrun names them: what the heartbeat, HSDP's mesh and the summary read
    assert [os.environ[k] for k in ("LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")] == ["8", "1", "2"]
    assert nodes_from_environment() == 2
    assert tasks_per_node("3,2(x2),1") == [3, 2, 2, 1]


def test_slurm_launcher_config_composes():
    register_schema()  # the recipes' defaults name the schema's structured configs
    overrides = ["hydra/launcher=trainrun_slurm", "hydra.launcher.nodes=4", "hydra.launcher.partition=gpu"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, "recipe=mild"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node, launcher.partition) == (4, 8, 8, "gpu")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launcher.devices=many"], "bad value for 'launcher.devices'"),
        (["launcher.nnodes=2", "launcher.node_rank=2"], "bad value for 'launcher.node_rank'"),
        (["launcher.nnodes=2"], "a multi-node launch needs 'launcher.master_port'"),
    ],
)
def test_bad_launcher_settings(args, message, tmp_path):
    result = run_cli(*EXACT, *args, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("node0", "'node0' is not host:port (node0:29400)"),
        (":29400", "':29400' is not host:port"),
        ("node0:abc", "'node0:abc': port 'abc' is not from 1 to 65535"),
        ("node0:65536", "'node0:65536': port '65536' is not from 1 to 65535"),
        ("node0:0", "port '0' is not from 1 to 65535"),
    ],
)
def test_a_rendezvous_endpoint_without_a_port_is_refused_before_anything_starts(endpoint, message, tmp_path):
    run_dir = tmp_path / "run"
    result = run_here(*EXACT, "launcher.nnodes=2", f"launcher.rdzv_endpoint={endpoint}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("trainrun: error: bad value for 'launcher.rdzv_endpoint': ")
    assert message in result.stderr and len(result.stderr.splitlines()) == 1 and not run_dir.exists()


def test_more_ranks_than_gpus_is_refused_before_any_process_starts(monkeypatch):
    """Each rank would take GPU 0 and NCCL would stop them all ("Duplicate GPU detected")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"'launcher.devices': 2 ranks on this node, which has 1 GPU"):
        check_gpus_for(2, "auto")
    check_gpus_for(2, "cpu")  # gloo ranks on the CPU
    check_gpus_for(1, "cuda")
