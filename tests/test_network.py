"""Several hosts' settings in this process, each decision on its own with the network faked: the route
to the master (a name that resolves to a loopback address, node 0 by its own name), what gloo and
NCCL are told, which host the rendezvous is routed to, how a lost node's ranks are named, and that
``launcher.requeue=false`` leaves Slurm alone. tests/test_multinode.py runs them between real hosts."""

from __future__ import annotations

import os
import socket
import stat
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from trainrun import launch, network
from trainrun.core import heartbeat
from trainrun.errors import ConfigError
from trainrun.network import Route, route_to
from trainrun.schema import LauncherConfig


@pytest.fixture
def resolving(monkeypatch):
    """Host names resolving as ``names`` says (an address each), the default route through eth0."""
    names: dict[str, str] = {}
    monkeypatch.setattr(network, "resolved", lambda host, key: names[host])
    monkeypatch.setattr(network, "outward_interface", lambda: ("eth0", "10.1.0.1"))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    return names


def test_a_master_name_that_resolves_to_a_loopback_address_is_refused_on_another_node(resolving):
    resolving["nodea"] = "127.0.1.1"  # not the literal localhost or 127.0.0.1, which the schema check refuses
    with pytest.raises(ConfigError, match=r"'nodea' is a loopback address \(127.0.1.1\) here"):
        route_to("nodea", "launcher.master_addr", hosts_master=False)


def test_node_0_named_by_its_own_host_name_finds_the_interface_its_peers_reach_it_by(resolving):
    """Debian's /etc/hosts maps the host's own name to 127.0.1.1, where its peers resolve it to its address."""
    resolving["nodea"] = "127.0.1.1"
    route = route_to("nodea", "launcher.master_addr", hosts_master=True)
    assert (route.interface, route.local_address) == ("eth0", "10.1.0.1")
    assert route.environment() == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert "nodea (127.0.1.1) is this host, which its peers reach through eth0 (10.1.0.1)" in route.describe()


def test_an_interface_the_user_named_is_kept_and_nccl_chooses_its_own(monkeypatch):
    route = Route("nodea", "10.1.0.1", "eth0", "10.1.0.2")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    assert route.environment() == {}  # the user's ib0 is not overwritten by the route's eth0
    assert "GLOO_SOCKET_IFNAME=ib0 as set; NCCL chooses its interface (NCCL_SOCKET_IFNAME unset)" in route.describe()
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert route.environment() == {"GLOO_SOCKET_IFNAME": "eth0"}  # gloo's only: NCCL's traffic keeps its own
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert route.describe().endswith("GLOO_SOCKET_IFNAME=eth0; NCCL_SOCKET_IFNAME=ib0 as set")


@pytest.mark.parametrize(
    ("settings", "routed"),
    [
        ({"master_addr": "nodea", "master_port": 29500, "node_rank": 1}, ("nodea", "launcher.master_addr", False)),
        ({"master_addr": "nodea", "master_port": 29500, "node_rank": 0}, ("nodea", "launcher.master_addr", True)),
        ({"rdzv_endpoint": "nodeb:29400", "master_addr": "nodea"}, ("nodeb", "launcher.rdzv_endpoint", True)),
    ],
)
def test_the_rendezvous_is_routed_to_the_host_that_serves_it(settings, routed, monkeypatch):
    """A static rendezvous is node 0's master address; a c10d one is its endpoint's host, wherever
    master_addr points."""
    asked = []

    def route(host: str, key: str, hosts_master: bool) -> Route:
        asked.append((host, key, hosts_master))
        return Route(host, "10.1.0.9", "eth0", "10.1.0.1")

    monkeypatch.setattr(launch, "route_to", route)
    launch.route_between_nodes(LauncherConfig(nnodes=2, **settings), started_elsewhere=False)
    assert asked == [routed]


def test_a_lost_nodes_ranks_are_named_by_that_node(monkeypatch):
    """Node 1 of two with two ranks each holds ranks 2-3: what its peers say when it is lost."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    environment = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "GROUP_WORLD_SIZE": "2",
                   "GROUP_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0",
                   heartbeat.NODE_ADDRESS: "10.1.0.2"}  # fmt: skip
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    beating = heartbeat.start(60.0, lambda line, reached: None)
    try:
        assert server.get(f"{heartbeat.PREFIX}/host/1").decode() == f"{socket.gethostname()}, 10.1.0.2, ranks 2-3"
    finally:
        beating.stop()


@pytest.fixture
def slurm_job(tmp_path, monkeypatch) -> Path:
    """A Slurm job's environment with a stub ``scontrol`` that records each call in ``called``."""
    called = tmp_path / "called"
    stub = tmp_path / "bin" / "scontrol"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\necho "$@" >> {called}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    return called


@pytest.mark.parametrize("requeue", [False, True])
def test_a_lost_node_requeues_the_job_only_where_launcher_requeue_allows(requeue, slurm_job):
    with pytest.raises(SystemExit) as ended:
        heartbeat.end_this_rank("lost node 1", survivor=True, requeue=requeue)
    assert ended.value.code == 1
    assert slurm_job.exists() == requeue
    if requeue:
        assert slurm_job.read_text() == "requeue 4242\n"


def test_ranks_across_nodes_are_told_to_raise_on_an_nccl_error_rather_than_end(monkeypatch):
    """NCCL's watchdog would end a rank on a failed collective before the heartbeat names the lost node:
    the ranks are told to abort the communicator and raise instead, unless the user said otherwise."""
    route = Route("nodea", "10.1.0.1", "eth0", "10.1.0.2")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    told = launch.node_environment(route)
    assert told == {
        "GLOO_SOCKET_IFNAME": "eth0",
        heartbeat.NODE_ADDRESS: "10.1.0.2",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    }
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in launch.node_environment(route)
