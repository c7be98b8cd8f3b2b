"""``launcher.fault_tolerance=replicas`` on one machine: its settings refused in one line before any
process starts, the lighthouse command, and how a step's shares are dealt out. Nodes lost and
joined across hosts: tests/test_multinode.py."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import run_here

from trainrun.core.replicas import dealt

TOLERANT = ["data=digits", "max_duration=1ba", "launcher.fault_tolerance=replicas", "launcher.nnodes=2"]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["data.loader=ffcv", "launcher.lighthouse=10.9.0.1:29530"], "data.loader"),
        (["launcher.rdzv_endpoint=10.9.0.1:29400"], "launcher.rdzv_endpoint"),
        (["launcher.lighthouse=nowhere"], "launcher.lighthouse"),
        (["launcher.master_addr=10.9.0.1"], "launcher.master_port"),
        (["launcher.nnodes=1"], "launcher.fault_tolerance"),
    ],
    ids=["ffcv", "rdzv_endpoint", "lighthouse", "no_port", "one_node"],
)
def test_what_replicas_cannot_do_is_refused_in_one_line_before_any_process(extra, key, tmp_path):
    result = run_here(*TOLERANT, *extra, f"hydra.run.dir={tmp_path / 'run'}")
    lines = [line for line in result.stderr.splitlines() if line.startswith("trainrun: error:")]
    assert result.returncode == 2 and len(lines) == 1 and f"'{key}'" in lines[0], result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def test_the_lighthouse_serves_its_port_and_the_start_store_until_stopped():
    port = free_port()
    lighthouse = subprocess.Popen(
        [sys.executable, "-m", "trainrun", "lighthouse", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert f"lighthouse at port {port}" in lighthouse.stdout.readline()
        for answering in (port, port + 1):  # the lighthouse, and the store a fresh run's nodes meet at
            with socket.create_connection(("127.0.0.1", answering), timeout=5):
                pass
        taken = run_here("lighthouse", "--port", str(port))
        assert taken.returncode == 2 and "'--port'" in taken.stderr, taken.stderr  # the port in use: one line
        lighthouse.send_signal(signal.SIGTERM)
        assert lighthouse.wait(timeout=30) == 0
    finally:
        if lighthouse.poll() is None:
            lighthouse.kill()
        lighthouse.communicate()


@pytest.mark.parametrize(
    ("node", "live", "planned", "shares"),
    [
        (0, [0, 1], 2, [0]),  # nobody missing: its own
        (0, [0], 2, [0, 1]),  # the other lost: both
        (1, [1], 2, [1, 0]),
        (0, [0, 2], 4, [0, 1]),  # two lost, dealt in turn over the two live
        (2, [0, 2], 4, [2, 3]),
        (1, [0, 1, 3], 5, [1, 4]),
        (1, None, 2, [1]),  # who is live not known (a failed quorum): its own
    ],
)
def test_each_missing_share_is_dealt_to_exactly_one_live_node(node, live, planned, shares):
    assert dealt(node, live, planned) == shares
    if live:
        every = sorted(share for other in live for share in dealt(other, live, planned))
        assert every == list(range(planned))


def this_machine_address() -> str:
    """An address of this machine that is not a loopback one (the route a datagram would take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # nothing is sent
        except OSError:
            pytest.skip("this machine has no address but loopback")
        return probe.getsockname()[0]


@pytest.mark.slow  # waits launcher.rendezvous_timeout's least, 5 s
def test_a_node_that_joins_a_finished_run_finds_no_lighthouse_in_one_line(tmp_path):
    """Node 1 of a run whose lighthouse is not up (its run ended, or node 0 never came): one line
    naming where it looked, exit 1, within launcher.rendezvous_timeout."""
    port, address = free_port(), this_machine_address()
    started = time.monotonic()
    result = run_here(
        *TOLERANT, f"launcher.lighthouse={address}:{port}", "launcher.node_rank=1", "launcher.rendezvous_timeout=5",
        f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.startswith("trainrun: error:")]
    assert result.returncode == 1 and len(lines) == 1 and f"{address}:{port + 1}" in lines[0], result.stderr
    assert time.monotonic() - started < 30


def test_inside_a_slurm_step_of_one_task_a_node_each_node_takes_its_place_from_slurm(monkeypatch):
    from trainrun.errors import ConfigError
    from trainrun.replica_groups import placed_by_slurm
    from trainrun.schema import LauncherConfig

    step = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1"}
    step |= {"SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "4242"}
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    placed = placed_by_slurm(LauncherConfig(devices="8"))
    assert (placed.nnodes, placed.node_rank, placed.master_addr, placed.master_port) == (2, 1, "gpu07", 24242)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "8(x2)")  # a task a rank: each node's trainrun would start 8
    with pytest.raises(ConfigError, match="--ntasks-per-node=1"):
        placed_by_slurm(LauncherConfig(devices="8"))
