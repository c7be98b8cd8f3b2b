"""trainrun under a real Slurm across two hosts: a slurmd in each of two network namespaces
(``node0``, ``node1``, their ``NodeAddr`` 10.213.0.1 and .2, names every host resolves as a cluster's
DNS gives them) and slurmctld in a third (10.213.0.3), the commands run where the controller is
reached; ``tests/network_hosts.py`` and ``tests/slurm_cluster.py`` make and remove them. No interface
variable is set: each rank finds the one that reaches the first node. The README's ``sbatch``
script over two nodes, its notice reaching both, a multirun of two-node jobs, and a node set down
mid-job: the job ends within a minute, is requeued and continues on the node left.

Needs root; skipped, saying why, where namespaces cannot be made. In ``make test-nodes``."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import assert_equal_to_summation_order
from network_hosts import Hosts, made_hosts
from slurm_cluster import (
    LAST,
    OVERRIDES,
    Cluster,
    assert_requeued_and_resumed,
    free_port,
    listening_ranks,
    multirun,
    running_cluster,
    sbatch_script,
    signal_while_held,
    slurm_conf,
    training_ranks,
    wait,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

NODES = ["node0", "node1"]
TWO_NODES = "--nodes=2 --ntasks-per-node=2"
ENDS_WITHIN = 60  # the bound: a lost node ends the job within a minute


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> Iterator[Hosts]:
    with made_hosts(3, tmp_path_factory.mktemp("names") / "hosts") as made:
        yield made


@pytest.fixture(scope="module")
def slurm(hosts, tmp_path_factory) -> Iterator[Cluster]:
    """slurmctld on host 2, a slurmd on hosts 0 and 1; Slurm's commands run on host 2."""
    folder = tmp_path_factory.mktemp("slurm")
    controller = f"{socket.gethostname().split('.')[0]}({hosts.address(2)})"  # slurmctld checks its host's name
    nodes = [f"{name} NodeAddr={hosts.address(index)}" for index, name in enumerate(NODES)]
    conf = slurm_conf(folder, controller, nodes, (free_port(), free_port()), 2)
    daemons = [[*hosts.enter(2), "slurmctld", "-i"]]
    daemons += [[*hosts.enter(index), "slurmd", "-N", name] for index, name in enumerate(NODES)]
    with running_cluster(folder, conf, daemons, NODES, hosts.enter(2)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory) -> Path:
    """The README's sbatch script over two nodes of two ranks, run to its end: its folder."""
    folder = tmp_path_factory.mktemp("straight")
    script = sbatch_script(folder / "run", folder / "job.out", overrides=OVERRIDES, tasks=TWO_NODES)
    state = slurm.finished(slurm.submit(script, folder))
    assert state["JobState"] == "COMPLETED", (folder / "job.out").read_text()
    return folder


def test_an_sbatch_script_over_two_nodes_trains_as_four_ranks(straight, hosts):
    """Each node's first rank says, in one line, the interface that reaches node 0 and what it sets."""
    output = (straight / "job.out").read_text()
    assert "4 rank(s)" in output, output
    for node in range(2):
        said = f"trainrun: node {node} of 2: node0 ({hosts.address(0)}) is reached through eth0 ({hosts.address(node)})"
        assert said in output, output
    provenance = json.loads((straight / "run" / "summary.json").read_text())["provenance"]
    assert (provenance["nodes"], provenance["devices"]) == (2, 4)


def test_a_notice_reaches_both_nodes_and_the_requeued_job_resumes_to_the_uninterrupted_weights(
    slurm, straight, tmp_path
):
    """``scancel --signal=USR1`` reaches the four ranks on the two hosts (their network namespaces
    two); every rank stops at the same step, rank 0 requeues, and the job started again on both
    nodes ends with the weights of the job run straight through (to float summation order)."""
    options = ["--requeue", "--open-mode=append"]
    script = sbatch_script(tmp_path / "run", tmp_path / "job.out", *options, overrides=OVERRIDES, tasks=TWO_NODES)
    job = slurm.submit(script, tmp_path)
    ranks: list[int] = []
    wait(lambda: ranks.extend(listening_ranks(tmp_path / "run", 4)) or ranks, 120, "four ranks to listen", every=0.02)
    assert len({os.stat(f"/proc/{pid}/ns/net").st_ino for pid in ranks}) == 2  # on both hosts
    signal_while_held(ranks, slurm, job)
    assert_requeued_and_resumed(slurm, job, tmp_path, straight, exact=False)


def test_a_multirun_through_the_slurm_launcher_runs_each_job_on_two_nodes(slurm, tmp_path):
    multirun(slurm, tmp_path, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2")
    for job in ("0", "1"):
        provenance = json.loads((tmp_path / job / "summary.json").read_text())["provenance"]
        assert (provenance["nodes"], provenance["devices"]) == (2, 4)


def checkpointing_job(slurm: Cluster, folder: Path, overrides: str, nodes: str, tasks: str) -> tuple[Path, Path, str]:
    """A job that keeps the nodes left when one is lost (``--no-kill``, for sbatch and srun) and may be
    requeued, a checkpoint every 5 steps, once its first is written: its run folder, output and id."""
    run, output = folder / "run", folder / "job.out"
    options = ["--exclusive", "--no-kill", "--requeue", "--open-mode=append"]
    overrides = f"{OVERRIDES} checkpoint.interval=5ba {overrides}"
    script = sbatch_script(run, output, *options, overrides=overrides, tasks=nodes, srun=f"srun --no-kill {tasks}")
    job = slurm.submit(script, folder)
    wait(lambda: any((run / "checkpoints").glob("*.pt")), 180, "the first checkpoint", every=0.1)
    return run, output, job


def test_a_node_set_down_mid_job_ends_it_within_a_minute_and_the_requeue_continues_on_the_other(
    slurm, straight, tmp_path
):
    """``scontrol update nodename=node1 state=down`` once the first checkpoint is written. The job
    asks for one or two nodes and keeps the nodes left (``--no-kill``, for sbatch and srun): Slurm
    kills node 1's ranks, the survivors end within a minute naming node 1, rank 0 requeues the job,
    and it starts again on node 0 alone (two ranks), where ``resume=auto`` continues the newest
    checkpoint to the straight job's weights (to float summation order: two ranks sum as four do not)."""
    overrides = "launcher.node_timeout=8"
    run, output, job = checkpointing_job(slurm, tmp_path, overrides, "--nodes=1-2", "--ntasks-per-node=2")
    try:
        first = training_ranks(run)
        slurm.run("scontrol", "update", "nodename=node1", "state=down", "reason=lost", check=True)
        lost_at = time.monotonic()
        wait(lambda: not set(first) & set(training_ranks(run)), ENDS_WITHIN, "the job's ranks to end")
        took = time.monotonic() - lost_at
        wait(lambda: slurm.restarted(job, output), 120, "the requeued job's credential to expire")
        state = slurm.finished(job)
    finally:
        slurm.run("scontrol", "update", "nodename=node1", "state=resume")
    said = output.read_text()
    assert took < ENDS_WITHIN, took
    assert state["JobState"] == "COMPLETED" and state["NodeList"] == "node0", (state, said[-1500:])
    assert "lost node 1 (" in said and "requeued Slurm job" in said and "resumed from" in said, said
    assert "2 rank(s)" in said  # the requeued job's banner
    got, expected = (
        torch.load(folder / "checkpoints" / LAST, weights_only=True)["model"] for folder in (run, straight / "run")
    )
    assert_equal_to_summation_order(got, expected)


def test_under_fault_tolerance_a_node_set_down_mid_job_costs_seconds_and_the_job_is_not_requeued(
    slurm, straight, tmp_path
):
    """``launcher.fault_tolerance=replicas`` in the sbatch script, one trainrun a node (``srun
    --ntasks-per-node=1``: each node's place from Slurm, node 0 the lighthouse): node 1 set down once
    the first checkpoint is written; node 0 trains node 1's share on and the run completes at the
    planned step, the job not requeued, with the straight job's weights (to float summation order: the
    nodes' gradients sum as four ranks' do not); ``summary.json`` names the fault."""
    overrides = "launcher.devices=2 launcher.fault_tolerance=replicas"
    run, output, job = checkpointing_job(slurm, tmp_path, overrides, "--nodes=2", "--ntasks-per-node=1")
    try:
        slurm.run("scontrol", "update", "nodename=node1", "state=down", "reason=lost", check=True)
        state = slurm.finished(job)
    finally:
        slurm.run("scontrol", "update", "nodename=node1", "state=resume")
    said = output.read_text()
    assert state["Restarts"] == "0", (state, said[-1500:])  # srun's code counts node 1's task: Slurm says FAILED
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["batches"] == 30, said[-1500:]
    assert "4 rank(s) on 2 replica nodes" in said and "node 1 (" in said and "lost at step" in said, said
    (fault,) = summary["faults"]
    assert (fault["event"], fault["node"], fault["ranks"]) == ("lost", 1, [2, 3]) and fault["seconds"] < 15
    got, expected = (
        torch.load(folder / "checkpoints" / LAST, weights_only=True)["model"] for folder in (run, straight / "run")
    )
    assert_equal_to_summation_order(got, expected)
