"""A fault-tolerant run's lighthouse and what it needs (``launcher.fault_tolerance=replicas``).

The lighthouse is torchft's: it decides, step by step, which nodes (replica groups) take part. Node 0's
launcher starts one unless ``launcher.lighthouse`` names one that ``trainrun lighthouse`` runs on a host
of its own; on node 0, losing node 0 loses the lighthouse, and the job ends as without fault tolerance.
"""

from __future__ import annotations

import dataclasses
import os
import re

from trainrun.errors import ConfigError
from trainrun.network import first_host
from trainrun.schema import LauncherConfig, TrainConfig

LIGHTHOUSE_HEARTBEAT_MS = 5_000  # a node unheard this long is left out of the next quorum
LIGHTHOUSE_JOIN_MS = 60_000  # a quorum waits this long for a node that is up but not yet asking (a start)


def start_lighthouse(port: int, key: str = "launcher.master_port"):
    """torchft's lighthouse on every address of this host at ``port`` (its server runs in this process)."""
    os.environ.setdefault("RUST_LOG", "warn")  # before torchft's first import: see check
    from torchft._torchft import LighthouseServer

    try:
        return LighthouseServer(
            bind=f"[::]:{port}",
            min_replicas=1,
            join_timeout_ms=LIGHTHOUSE_JOIN_MS,
            heartbeat_timeout_ms=LIGHTHOUSE_HEARTBEAT_MS,
        )
    except Exception as error:  # torchft's: the port taken, say
        raise ConfigError(f"bad value for '{key}': cannot start a lighthouse at port {port} ({error})") from None


def lighthouse_of(settings: LauncherConfig) -> tuple[str, int, str]:
    """The lighthouse's host, port, and the key that says them."""
    if settings.lighthouse:
        host, _, port = settings.lighthouse.rpartition(":")
        return host.strip("[]"), int(port), "launcher.lighthouse"
    return settings.master_addr, settings.master_port, "launcher.master_addr"


def check(config: TrainConfig, started_elsewhere: bool) -> None:
    """What ``launcher.fault_tolerance=replicas`` needs, before any process starts."""
    settings, key = config.launcher, "launcher.fault_tolerance"
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's lines of every quorum, read at its import: RUST_LOG=info
    try:
        import torchft  # noqa: F401
    except ImportError:
        raise ConfigError(f"bad value for '{key}': replicas needs torchft (pip install 'trainrun[ft]')") from None
    if settings.nnodes < 2:
        raise ConfigError(
            f"bad value for '{key}': replicas trains on when a node is lost; launcher.nnodes=1 has no other node"
        )
    if started_elsewhere:
        raise ConfigError(
            f"bad value for '{key}': replicas starts each node's ranks itself; run one trainrun a node "
            "(launcher.nnodes, launcher.node_rank, or srun --ntasks-per-node=1), not under torchrun"
        )
    if settings.rdzv_endpoint:
        raise ConfigError(
            f"bad value for 'launcher.rdzv_endpoint': {key}=replicas names each node by launcher.node_rank"
        )
    if config.data.loader == "ffcv":
        raise ConfigError(
            f"bad value for 'data.loader': {key}=replicas reads a lost node's share through data.loader=torch"
        )
    if settings.lighthouse:
        host, _, port = settings.lighthouse.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"bad value for 'launcher.lighthouse': '{settings.lighthouse}' is not HOST:PORT")
    elif settings.master_port is None and settings.nnodes > 1:
        raise ConfigError(
            f"bad value for 'launcher.master_port': {key}=replicas starts the lighthouse on node 0 at this port "
            "(or name one: launcher.lighthouse=HOST:PORT)"
        )


def start_store(lighthouse_port: int):
    """Beside the lighthouse, at its port + 1: the store in which a fresh run's nodes meet before their
    first step (:func:`trainrun.core.start_store.wait_for_every_node`)."""
    from torch.distributed import TCPStore

    try:
        return TCPStore("0.0.0.0", lighthouse_port + 1, is_master=True, wait_for_workers=False)
    except Exception as error:
        raise ConfigError(f"cannot start the start store at port {lighthouse_port + 1} ({error})") from None


def placed_by_slurm(settings: LauncherConfig) -> LauncherConfig:
    """Inside a Slurm step of one task a node (``srun --ntasks-per-node=1``), the node's place from
    Slurm: ``nnodes`` and ``node_rank`` from the step, and without a lighthouse named, node 0's
    address and a port from the job's id (as for a run without fault tolerance); else as set."""
    env = os.environ
    if "SLURM_PROCID" not in env or int(env.get("SLURM_STEP_NUM_TASKS", "1")) <= 1:
        return settings
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", "1")
    if set(re.findall(r"(\d+)(?:\(x\d+\))?", per_node)) != {"1"}:
        raise ConfigError(
            f"bad value for 'launcher.fault_tolerance': replicas runs one trainrun a node, which starts "
            f"launcher.devices ranks; this srun step has {per_node} tasks a node (srun --ntasks-per-node=1)"
        )
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or settings.master_addr
    return dataclasses.replace(
        settings,
        nnodes=int(env.get("SLURM_STEP_NUM_NODES") or env["SLURM_STEP_NUM_TASKS"]),
        node_rank=int(env.get("SLURM_NODEID", "0")),
        master_addr=first_host(nodes),
        master_port=settings.master_port or 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000,
    )
