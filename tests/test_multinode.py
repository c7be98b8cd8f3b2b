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
