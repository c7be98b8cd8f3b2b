"""trainrun on several hosts: each host a Linux network namespace of this machine
(``tests/network_hosts.py``); the tests set no interface variable. Run folders are one folder
every host sees (a shared filesystem); each host's ``data.cache_dir`` is its own.

Needs root (CI runs as root); skipped, saying why, where namespaces cannot be made. A suite of its
own (``make test-nodes``, in ``.ci/run``): four ranks on a 2-core machine are minutes of work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import EXACT, assert_equal_to_summation_order, read_metrics
from network_hosts import ONE_THREAD, Hosts, made_hosts

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

PORT = 29512
LOST_AFTER = 8  # launcher.node_timeout in these tests: seconds a node may go unheard
ENDS_WITHIN = 60  # the bound: every node ends within a minute of a loss


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with made_hosts(2) as made:
        yield made


def master_form(hosts: Hosts) -> list[list[str]]:
    """Each node's launch with ``master_addr`` (node 0's address as the others reach it)."""
    common = ["launcher.nnodes=2", f"launcher.master_addr={hosts.address(0)}", f"launcher.master_port={PORT}"]
    return [[*common, f"launcher.node_rank={node}"] for node in range(2)]


def rendezvous_form(hosts: Hosts) -> list[list[str]]:
    """Each node's launch with a c10d rendezvous at node 0 (the same command on both)."""
    return [["launcher.nnodes=2", f"launcher.rdzv_endpoint={hosts.address(0)}:{PORT + 1}"]] * 2


def on_two_hosts(hosts: Hosts, args: list[str], forms: list[list[str]], run: Path, cache: Path) -> list[tuple]:
    """``args`` on both hosts, one folder for the run, a cache each; (exit code, stdout, stderr) of each."""
    processes = [
        hosts.start(node, *args, *forms[node], f"hydra.run.dir={run}", f"data.cache_dir={cache}/host{node}")
        for node in range(2)
    ]
    return [(process.wait(timeout=300), *process.communicate()) for process in processes]


def on_one_host(args: list[str], run: Path, cache: Path) -> None:
    """``args`` on this machine, with host 0's data cache: a token store built elsewhere would hold
    another tokenizer (Hugging Face's tokenizer training is not deterministic; a multi-node run's
    nodes take rank 0's)."""
    result = subprocess.run(
        [sys.executable, "-m", "trainrun", *args, f"hydra.run.dir={run}", f"data.cache_dir={cache}/host0"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **ONE_THREAD},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def newest_weights(run: Path) -> dict[str, torch.Tensor]:
    from trainrun.core.sharded_checkpoint import whole_weights

    newest = max((run / "checkpoints").iterdir(), key=lambda path: int(path.name.split("-ba")[1].split(".")[0]))
    return whole_weights(newest) if newest.is_dir() else torch.load(newest, weights_only=True)["model"]


SMALL = [arg for arg in EXACT if not arg.startswith("max_duration=")]  # group norm: equal to summation order
DDP = [*SMALL, "max_duration=8ba", "eval_interval=8ba", "eval_batch_size=64"]


@pytest.mark.parametrize(
    ("form", "loader"), [(master_form, "torch"), (rendezvous_form, "ffcv")], ids=["master_addr", "rdzv_endpoint"]
)
def test_two_nodes_of_two_ranks_train_the_weights_of_one_node_of_four(hosts, form, loader, tmp_path):
    """Through FFCV, each host's local rank 0 writes the data's cache to its own ``data.cache_dir``."""
    args = [*DDP, f"data.loader={loader}"]
    on_one_host([*args, "launcher.devices=4"], tmp_path / "one", tmp_path)
    ended = on_two_hosts(hosts, [*args, "launcher.devices=2"], form(hosts), tmp_path / "two", tmp_path)
    for node, (code, _, stderr) in enumerate(ended):
        assert code == 0, f"node {node}: {stderr}"
        assert "reached through eth0" in stderr and "GLOO_SOCKET_IFNAME=eth0" in stderr, stderr  # said, one line
    assert_equal_to_summation_order(newest_weights(tmp_path / "two"), newest_weights(tmp_path / "one"))
    provenance = json.loads((tmp_path / "two" / "summary.json").read_text())["provenance"]
    assert (provenance["nodes"], provenance["devices"]) == (2, 4)
    if loader == "ffcv":
        assert all(any((tmp_path / f"host{node}").rglob("*.beton")) for node in range(2))


LLAMA = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "optimizer=sgd", "optimizer.lr=0.05"]
LLAMA += ["optimizer.momentum=0.9", "train_batch_size=8", "data.text.max_seq_len=32", "progress=false"]
LLAMA += ["parallel=fsdp", "max_duration=8ba", "eval_interval=4ba", "checkpoint.interval=4ba", "checkpoint.keep=5"]
LLAMA += ["export=false", "scheduler.t_warmup=0ba"]


def test_hsdp_over_two_nodes_trains_the_weights_of_fsdp_on_four_ranks_and_resumes_on_one_node(hosts, tmp_path):
    """Sharded within a node, replicated across the two (HSDP); its DCP checkpoint of step 4 resumed on
    one node of two ranks ends with the same weights."""
    on_one_host([*LLAMA, "launcher.devices=4"], tmp_path / "one", tmp_path)
    ended = on_two_hosts(hosts, [*LLAMA, "launcher.devices=2"], master_form(hosts), tmp_path / "two", tmp_path)
    for node, (code, _, stderr) in enumerate(ended):
        assert code == 0, f"node {node}: {stderr}"
    expected = newest_weights(tmp_path / "one")
    assert_equal_to_summation_order(newest_weights(tmp_path / "two"), expected)
    for key in ("train_loss", "eval_loss"):
        assert [row[key] for row in read_metrics(tmp_path / "two")] == pytest.approx(
            [row[key] for row in read_metrics(tmp_path / "one")], rel=1e-4
        ), key
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    os.rename(tmp_path / "two" / "checkpoints" / "ep0-ba4", resumed / "checkpoints" / "ep0-ba4")
    on_one_host([*LLAMA, "launcher.devices=2", "resume=auto"], resumed, tmp_path)
    assert_equal_to_summation_order(newest_weights(resumed), expected)


LONG = [*SMALL, "max_duration=400ba", "checkpoint.interval=5ba", "checkpoint.keep=2", "eval_batch_size=64"]


@pytest.mark.parametrize("loss", ["killed", "cut_off"])
def test_a_lost_node_ends_every_node_naming_it_and_one_node_resumes_to_the_uninterrupted_weights(hosts, loss, tmp_path):
    """Node 1 killed outright (its peers' connections reset) or cut off (its link down: nothing
    resets): every node ends within a minute, exit 1, the survivor naming node 1's host; the
    newest checkpoint is whole, and ``resume=auto`` on one node of two ranks continues it to the
    weights of a run never interrupted. Inside a Slurm job (its id, and an ``scontrol`` that notes
    what it is asked) the survivor requeues the job; the node cut off, which reaches no one, does not."""
    run = tmp_path / "run"
    scontrol, asked = tmp_path / "bin" / "scontrol", tmp_path / "scontrol.log"
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$(hostname -I) $*" >> {asked}\n')
    scontrol.chmod(0o755)
    slurm = {"SLURM_JOB_ID": "4242", "PATH": f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}"}
    processes = [
        hosts.start(
            node,
            *LONG,
            *master_form(hosts)[node],
            f"launcher.node_timeout={LOST_AFTER}",
            f"hydra.run.dir={run}",
            f"data.cache_dir={tmp_path}/host{node}",
            env=slurm if loss == "cut_off" else None,
        )
        for node in range(2)
    ]
    try:
        deadline = time.monotonic() + 180
        while not any((run / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
            assert all(process.poll() is None for process in processes), processes[0].communicate()
            time.sleep(0.1)
        lost_at = time.monotonic()
        if loss == "killed":
            os.killpg(processes[1].pid, signal.SIGKILL)
        else:
            hosts.cut(1)
        ended = [(process.wait(timeout=ENDS_WITHIN + 30), *process.communicate()) for process in processes]
        took = time.monotonic() - lost_at
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        subprocess.run(["ip", "-n", hosts.switch, "link", "set", hosts.ports[1], "up"], capture_output=True)
    assert took < ENDS_WITHIN, took
    code, _, stderr = ended[0]
    lines = [line for line in stderr.splitlines() if line.startswith("trainrun: error:")]
    assert code == 1 and len(lines) == 1, stderr
    assert hosts.address(1) in lines[0], lines[0]  # the lost host, by its address
    if loss == "cut_off":
        code, _, stderr = ended[1]
        assert code == 1 and f"lost the run's store on node 0 ({hosts.address(0)})" in stderr, stderr
        assert "requeued Slurm job 4242" in lines[0]
        assert asked.read_text().split() == [hosts.address(0), "requeue", "4242"]  # the survivor, once
    stopped_at = max(int(path.stem.split("-ba")[1]) for path in run.glob("checkpoints/*.pt"))
    assert stopped_at < 400  # lost before the end
    on_one_host([*LONG, "launcher.devices=2", "resume=auto"], run, tmp_path)  # the newest checkpoint is whole
    on_one_host([*LONG, "launcher.devices=2"], tmp_path / "whole", tmp_path)
    whole = newest_weights(tmp_path / "whole")
    assert all(torch.equal(value, whole[name]) for name, value in newest_weights(run).items())
    assert read_metrics(run)[-1]["batch"] == 400


# ---- launcher.fault_tolerance=replicas: each node a replica group, a lighthouse on a third host ----

LIGHTHOUSE_PORT = 29530
GOES_ON_WITHIN = 15  # the issue's bound: the survivors' next step within this many seconds of a loss
REPLICAS = [*SMALL, "max_duration=240ba", "eval_interval=240ba", "eval_batch_size=64", "checkpoint.interval=20ba"]
REPLICAS += ["checkpoint.keep=2"]
LLAMA_LONG = [arg for arg in LLAMA if not arg.startswith(("max_duration=", "eval_interval=", "checkpoint."))]
LLAMA_LONG += ["max_duration=150ba", "eval_interval=150ba", "checkpoint.interval=25ba", "checkpoint.keep=2"]
RUNS = {"ddp": REPLICAS, "hsdp": LLAMA_LONG}


@pytest.fixture(scope="module")
def three_hosts() -> Iterator[Hosts]:
    """Nodes 0 and 1, and the lighthouse's host."""
    with made_hosts(3) as made:
        yield made


class ReplicaRun:
    """Two nodes of two ranks under fault_tolerance=replicas, the lighthouse on host 2."""

    def __init__(self, hosts: Hosts, args: list[str], tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
        self.hosts, self.run, self.cache = hosts, tmp_path / "run", tmp_path
        self.lighthouse = hosts.start(2, "lighthouse", "--port", str(LIGHTHOUSE_PORT))
        common = ["launcher.devices=2", "launcher.nnodes=2", "launcher.fault_tolerance=replicas"]
        common += [f"launcher.lighthouse={hosts.address(2)}:{LIGHTHOUSE_PORT}", f"hydra.run.dir={self.run}", *extra]
        self.command = [*args, *common]
        self.nodes = [self.start(node) for node in range(2)]

    def start(self, node: int, *extra: str) -> subprocess.Popen:
        where = [f"launcher.node_rank={node}", f"data.cache_dir={self.cache}/h{node}", *extra]
        return self.hosts.start(node, *self.command, *where)

    def wait_for_checkpoint(self) -> None:
        deadline = time.monotonic() + 240
        while not any((self.run / "checkpoints").glob("*-ba*")) and time.monotonic() < deadline:
            assert all(node.poll() is None for node in self.nodes), self.nodes[0].communicate()
            time.sleep(0.1)

    @staticmethod
    def ended(*processes: subprocess.Popen) -> list[tuple[int, str, str]]:
        return [(process.wait(timeout=300), *process.communicate()) for process in processes]

    def stop(self) -> None:
        for process in [self.lighthouse, *self.nodes]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        self.lighthouse.communicate()


def fingerprint(stderr: str, node: int) -> str:
    """The weights' fingerprint a node says at its end."""
    lines = [line for line in stderr.splitlines() if line.startswith(f"trainrun: node {node} ended at step ")]
    assert len(lines) == 1, stderr
    return lines[0].rsplit(" ", 1)[1]


def faults(run: Path) -> list[dict]:
    return json.loads((run / "summary.json").read_text())["faults"]


def assert_both_ended_alike(ended: list[tuple[int, str, str]]) -> str:
    """Both nodes ended rc 0 with the same weights; their fingerprint."""
    for node, (code, _, stderr) in enumerate(ended):
        assert code == 0, f"node {node}: {stderr}"
    assert fingerprint(ended[0][2], 0) == fingerprint(ended[1][2], 1)
    return fingerprint(ended[0][2], 0)


@pytest.fixture(scope="module")
def uninterrupted(three_hosts, tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    """The weights of each fault-tolerant run never interrupted: a step's gradients are the same to
    the bit whichever node trained a share (core/replicas.py), so a run that lost a node and one that
    did not end alike however long they train (a run without fault tolerance sums its ranks'
    gradients in another order, which 240 steps carry far beyond float noise)."""
    made = tmp_path_factory.mktemp
    return {name: newest_weights(fault_free(three_hosts, args, made(name))) for name, args in RUNS.items()}


def fault_free(hosts: Hosts, args: list[str], folder: Path) -> Path:
    """``args`` on two nodes to their end without a fault, both alike: the run's folder."""
    run = ReplicaRun(hosts, args, folder)
    try:
        assert_both_ended_alike(run.ended(*run.nodes))
    finally:
        run.stop()
    assert faults(run.run) == []
    return run.run


@pytest.mark.parametrize("parallel", ["ddp", "hsdp"])
def test_replica_groups_without_a_fault_train_the_weights_of_one_node(three_hosts, parallel, tmp_path):
    """Case 1: no fault; both nodes end at the planned step with the same weights, equal to summation
    order to those of one node of four ranks without fault tolerance (DDP, or FSDP2)."""
    args = DDP if parallel == "ddp" else LLAMA
    on_one_host([*args, "launcher.devices=4"], tmp_path / "one", tmp_path)
    run = fault_free(three_hosts, args, tmp_path)
    provenance = json.loads((run / "summary.json").read_text())["provenance"]
    assert (provenance["nodes"], provenance["devices"]) == (2, 4)
    assert_equal_to_summation_order(newest_weights(run), newest_weights(tmp_path / "one"))


@pytest.mark.parametrize("loss", ["killed", "cut_off"])
def test_a_lost_replica_costs_seconds_and_the_survivor_ends_with_the_uninterrupted_weights(
    three_hosts, uninterrupted, loss, tmp_path
):
    """Cases 2 and 3: node 1 killed, or its link down (nothing resets: the exchange waits
    launcher.replica_timeout); node 0 goes on within 15 s, takes node 1's share of every step and ends
    rc 0 at the planned step with the weights of the run never interrupted; summary.json names the
    fault. Node 1 cut off ends when the lighthouse has not answered for launcher.node_timeout."""
    run = ReplicaRun(three_hosts, REPLICAS, tmp_path, ("launcher.node_timeout=8",))
    try:
        run.wait_for_checkpoint()
        if loss == "killed":
            os.killpg(run.nodes[1].pid, signal.SIGKILL)
        else:
            three_hosts.cut(1)
        ended = run.ended(*run.nodes)
    finally:
        run.stop()
        subprocess.run(["ip", "-n", three_hosts.switch, "link", "set", three_hosts.ports[1], "up"], capture_output=True)
    code, _, stderr = ended[0]
    assert code == 0, stderr
    (fault,) = faults(run.run)
    assert (fault["event"], fault["node"], fault["host"], fault["ranks"]) == ("lost", 1, three_hosts.address(1), [2, 3])
    assert fault["seconds"] < GOES_ON_WITHIN, (fault, stderr[-2000:])  # node 0's lines say which exchange waited
    print(f"node 1 {loss}: node 0 went on {fault['seconds']} s after node 1's last step")  # docs/distributed.md
    assert f"node 1 ({three_hosts.address(1)}) lost at step {fault['step']}" in stderr
    last = read_metrics(run.run)[-1]
    assert (last["batch"], last["lost_seconds"]) == (240, fault["seconds"])
    assert all(torch.equal(value, uninterrupted["ddp"][name]) for name, value in newest_weights(run.run).items())
    if loss == "cut_off":
        code, _, stderr = ended[1]
        assert code == 1 and f"lost the lighthouse at {three_hosts.address(2)}:{LIGHTHOUSE_PORT}" in stderr, stderr


def test_under_replica_batch_shrink_a_lost_replicas_share_is_not_trained(three_hosts, uninterrupted, tmp_path):
    """torchft's own way, as an option: node 0 goes on alone with its own share only (a smaller batch
    while node 1 is missing), ends rc 0 at the planned step, and its weights are not the uninterrupted
    run's (node 1's samples were skipped)."""
    run = ReplicaRun(three_hosts, REPLICAS, tmp_path, ("launcher.replica_batch=shrink",))
    try:
        run.wait_for_checkpoint()
        os.killpg(run.nodes[1].pid, signal.SIGKILL)
        code, _, stderr = run.ended(run.nodes[0])[0]
    finally:
        run.stop()
    assert code == 0 and "lost at step" in stderr and "its share is not trained (replica_batch=shrink)" in stderr
    (fault,) = faults(run.run)
    assert fault["event"] == "lost" and read_metrics(run.run)[-1]["batch"] == 240
    assert not all(torch.equal(value, uninterrupted["ddp"][name]) for name, value in newest_weights(run.run).items())


@pytest.mark.parametrize("parallel", ["ddp", "hsdp"])
def test_a_replica_started_again_joins_live_and_every_node_ends_with_the_uninterrupted_weights(
    three_hosts, uninterrupted, parallel, tmp_path
):
    """Cases 4 and 5: node 1 killed, then given the same command: it joins at a step boundary with
    node 0's weights, optimizer state and data position (whole under DDP, each rank's shards under
    FSDP2 within the node), and both nodes end rc 0 with the same weights, the uninterrupted run's."""
    run = ReplicaRun(three_hosts, RUNS[parallel], tmp_path)
    try:
        run.wait_for_checkpoint()
        os.killpg(run.nodes[1].pid, signal.SIGKILL)
        run.nodes[1].wait()
        run.nodes[1] = run.start(1)
        ended = run.ended(*run.nodes)
    finally:
        run.stop()
    assert_both_ended_alike(ended)
    assert "node 1 joined at step" in ended[1][2]
    lost, joined = faults(run.run)
    assert (lost["event"], joined["event"], joined["node"]) == ("lost", "joined", 1) and lost["step"] <= joined["step"]
    weights = newest_weights(run.run)
    assert all(torch.equal(value, uninterrupted[parallel][name]) for name, value in weights.items())


def test_the_lighthouse_lost_ends_every_node_naming_it_and_resume_continues(three_hosts, uninterrupted, tmp_path):
    """Case 6: the lighthouse's host cut off: both nodes end within a minute, naming it; resume=auto on
    both, the lighthouse back, continues the newest checkpoint to the uninterrupted weights."""
    run = ReplicaRun(three_hosts, REPLICAS, tmp_path, ("launcher.node_timeout=8",))
    try:
        run.wait_for_checkpoint()
        lost_at = time.monotonic()
        three_hosts.cut(2)
        ended = run.ended(*run.nodes)
        took = time.monotonic() - lost_at
    finally:
        run.stop()
        subprocess.run(["ip", "-n", three_hosts.switch, "link", "set", three_hosts.ports[2], "up"], capture_output=True)
    assert took < ENDS_WITHIN, took
    for code, _, stderr in ended:
        assert code == 1 and f"lost the lighthouse at {three_hosts.address(2)}:{LIGHTHOUSE_PORT}" in stderr, stderr
    stopped_at = max(int(path.stem.split("-ba")[1]) for path in run.run.glob("checkpoints/*.pt"))
    assert stopped_at < 240
    resumed = ReplicaRun(three_hosts, REPLICAS, tmp_path, ("resume=auto",))
    try:
        assert_both_ended_alike(resumed.ended(*resumed.nodes))
    finally:
        resumed.stop()
    assert all(torch.equal(value, uninterrupted["ddp"][name]) for name, value in newest_weights(run.run).items())


def test_the_fault_cost_bench_runs_tiny():
    """bench/fault_cost.py, the measure in docs/distributed.md, at 40 steps with a loss at step 20: its
    table, every run ending 0, the run with fault tolerance naming its loss."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, str(root / "bench" / "fault_cost.py"), "--steps", "40", "--every", "20", "--checkpoint", "10"],
        capture_output=True, text=True, timeout=900, env={**os.environ, **ONE_THREAD},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| replicas |" in result.stdout and "| none (requeued, resume=auto) |" in result.stdout, result.stdout
    assert result.stdout.count("exit codes [0, 0]") == 2 and '"event": "lost"' in result.stdout, result.stdout
