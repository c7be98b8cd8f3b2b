"""Start one training process per device with torch.distributed's elastic launcher.

``launch`` trains in this process when one process is enough, or when the processes were
already started by someone else (``torchrun`` sets WORLD_SIZE; Slurm sets SLURM_PROCID and
SLURM_NTASKS, which are translated to torch's variables). Otherwise it starts
``launcher.devices`` workers on this node (on ``launcher.nnodes`` nodes, rendezvous at
``master_addr:master_port`` or ``rdzv_endpoint``), each training its rank of the same run in
the same, already decided output directory. If any worker fails, the agent stops the others,
and the failing rank's exit code comes back.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import re
import socket
import sys
import time
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from trainrun import replica_groups, run_files
from trainrun.core import checkpoint, heartbeat, preemption
from trainrun.core.distributed import (
    REPLICA,
    REPLICA_TIMEOUT,
    REPLICAS,
    check_gpus_for,
    cores_per_process,
    lost_a_peer,
    nodes_from_environment,
    record_failure,
)
from trainrun.core.precision import check_float8
from trainrun.core.start_store import START_STORE, under_way
from trainrun.errors import ConfigError, TrainrunError, describe_error
from trainrun.network import Route, first_host, is_this_host, rendezvous_answers, route_to
from trainrun.schema import LauncherConfig, TrainConfig
from trainrun.validation import check_batch_split, check_microbatch_size

SHUTDOWN_SECONDS = 10  # after SIGTERM, workers still alive are killed
# A rank whose collective fails because a peer died waits this long before it exits, so that the
# launcher, which polls every half second, reports the rank that failed first, not this one.
PEER_LOSS_GRACE_SECONDS = 5
ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")  # their failure logs: --debug only


class LaunchFailed(TrainrunError):
    """A worker process failed; every other worker was stopped."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def device_count(devices: str) -> int:
    """Processes to start on this node for ``launcher.devices``."""
    if devices == "auto":
        return torch.cuda.device_count() or 1
    return int(devices)


def adopt_slurm_environment(settings: LauncherConfig) -> bool:
    """Inside a multi-task ``srun`` step, set torch.distributed's variables from Slurm's (torchrun's
    names for the node's place and size among them); True if so.

    Only step-scoped variables count: an ``sbatch`` script's own (batch) step also has
    ``SLURM_PROCID`` and the job's ``SLURM_NTASKS``, but it is one process, and trainrun run there
    launches its workers itself.
    """
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if "SLURM_PROCID" not in os.environ or tasks <= 1:
        return False
    port = settings.master_port or 20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or settings.master_addr
    node = int(os.environ.get("SLURM_NODEID", "0"))
    per_node = tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE") or str(tasks))
    os.environ.update(
        RANK=os.environ["SLURM_PROCID"],
        WORLD_SIZE=str(tasks),
        LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"),
        LOCAL_WORLD_SIZE=str(per_node[node]),
        GROUP_RANK=str(node),
        GROUP_WORLD_SIZE=str(len(per_node)),
        MASTER_ADDR=first_host(nodes),
        MASTER_PORT=str(port),
    )
    return True


def tasks_per_node(counts: str) -> list[int]:
    """A Slurm step's tasks on each of its nodes, from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``)."""
    expanded = []
    for part in counts.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ConfigError(f"cannot read Slurm's tasks a node '{counts}'")
        expanded += [int(match[1])] * int(match[2] or 1)
    return expanded


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def check_port_free(port: int) -> None:
    """Fail with a clear message if ``port`` is taken on this machine."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            raise ConfigError(
                f"bad value for 'launcher.master_port': port {port} is already in use on this machine "
                "(choose another, or leave it unset for a free one on a single node)"
            ) from None


def launch_config(settings: LauncherConfig, processes: int, route: Route | None = None) -> LaunchConfig:
    """torch's launch settings: static rendezvous at master_addr:port, or c10d at rdzv_endpoint, which
    this node hosts where the endpoint is one of its addresses (torch would decide it from the host
    name, which on many machines resolves to a loopback address on every node); ``route``: this
    node's address as the other nodes reach it."""
    if settings.rdzv_endpoint:
        backend, endpoint = "c10d", settings.rdzv_endpoint
        options = {"join_timeout": settings.rendezvous_timeout}
        options |= {} if route is None else {"is_host": is_this_host(route.address)}
    else:
        port = settings.master_port or free_port()
        if settings.node_rank == 0:
            check_port_free(port)
        backend, endpoint = "static", f"{settings.master_addr}:{port}"
        options = {"rank": settings.node_rank, "timeout": settings.rendezvous_timeout}
    return LaunchConfig(
        min_nodes=settings.nnodes,
        max_nodes=settings.nnodes,
        nproc_per_node=processes,
        run_id="trainrun",
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=options,
        local_addr=route.local_address if route is not None else None,
        max_restarts=0,
        monitor_interval=0.5,
        start_method="forkserver",  # ranks forked from one process that imported trainrun (see run_workers)
        **_shutdown_setting(),
    )


def _shutdown_setting() -> dict[str, int]:
    """``shutdown_timeout`` where this torch's LaunchConfig takes it (2.11's does not: it gives
    workers 30 s after SIGTERM, and refused the keyword, so no run of two ranks started)."""
    fields = {field.name for field in dataclasses.fields(LaunchConfig)}
    return {"shutdown_timeout": SHUTDOWN_SECONDS} if "shutdown_timeout" in fields else {}


def run_workers(
    settings: LauncherConfig,
    processes: int,
    worker,
    *args: object,
    show_failure_logs: bool = False,
    route: Route | None = None,
) -> None:
    """Run ``worker(*args)`` in ``processes`` ranks on this node; raise :class:`LaunchFailed` if one fails.

    The error names the rank that failed first and says why: its own one-line message (recorded
    by :func:`train_worker`), the signal that killed it, or its exit code. torch elastic's own
    multi-line failure log is shown only with ``show_failure_logs``.
    """
    quiet = [] if show_failure_logs else [logging.getLogger(name) for name in ELASTIC_LOGGERS]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)
    # the fork server imports torch and trainrun once, before any rank starts (no CUDA, no threads
    # yet: safe to fork); every rank is forked from it instead of importing them again (2-4 s of CPU a
    # rank on the 2-core test machines); a later launch in the same process reuses the server
    multiprocessing.set_forkserver_preload(["trainrun.launch", "trainrun.run"])
    preemption.ignore_in_launcher()  # Slurm's notice is the ranks' to act on (they listen again)
    launch = launch_config(settings, processes, route)
    hosts = launch.rdzv_configs.get("is_host", settings.node_rank == 0)
    try:
        if (
            settings.nnodes > 1
            and not hosts
            and not rendezvous_answers(launch.rdzv_endpoint, settings.rendezvous_timeout)
        ):
            raise LaunchFailed(
                f"node {settings.node_rank} found no rendezvous at {launch.rdzv_endpoint} within "
                f"launcher.rendezvous_timeout={settings.rendezvous_timeout} s: is node 0 up there, and reachable?",
                1,
            )
        elastic_launch(launch, worker)(*args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        if failure.exitcode < 0:
            raise LaunchFailed(
                f"rank {rank} was killed by {failure.signal_name()}; every rank was stopped", 1
            ) from None
        if isinstance(failure.error_file_data.get("message"), str):  # a line recorded by train_worker
            raise LaunchFailed(f"{failure.message}; every rank was stopped", failure.exitcode) from None
        raise LaunchFailed(
            f"rank {rank} failed (exit code {failure.exitcode}); every rank was stopped", failure.exitcode
        ) from None
    except SignalException:
        raise KeyboardInterrupt from None
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)


def train_worker(
    config: TrainConfig, run_dir: str, config_yaml: str, debug: bool = False, environment: dict | None = None
) -> None:
    """One rank of a launched run, of the config the launching process validated: an error becomes
    one line naming the rank, handed to the launching process (which prints it, once), and the exit
    code. ``environment``: variables the launch decided (the interface that reaches the other nodes),
    set here since a fork server started by an earlier launch keeps the environment it started with."""
    from trainrun.run import train

    os.environ.update(environment or {})
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cores_per_process())
    rank = os.environ.get("RANK", "0")
    try:
        train(config, Path(run_dir), config_yaml)
    except KeyboardInterrupt:
        print(f"trainrun: rank {rank} interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:
        if debug:
            raise
        text, code = describe_error(error)
        if lost_a_peer(error):  # a consequence: let the agent see the rank that failed first
            time.sleep(PEER_LOSS_GRACE_SECONDS)
        record_failure(f"rank {rank}: {text}")
        sys.exit(code)


AUTO_MEMORY_SHARE = 0.95  # of a GPU's memory that auto under fsdp plans for (the CUDA context takes some)


def microbatch_before_start(config: TrainConfig) -> TrainConfig:
    """``device_train_microbatch_size=auto`` under fsdp, decided before any worker starts (a pass
    retried after running out of memory would leave the other ranks waiting in a gather): the largest
    micro-batch whose step and evaluation ``trainrun estimate`` finds within this node's GPU memory
    (or the ``hardware`` group's), halving from the per-rank batch as ``auto`` does."""
    from trainrun.estimate import auto_microbatch, world_of

    if config.device != "cpu" and torch.cuda.is_available():
        limit = torch.cuda.get_device_properties(0).total_memory / 1e9 * AUTO_MEMORY_SHARE
    else:
        limit = config.hardware.device_memory_gb
    per_rank = config.train_batch_size // world_of(config)[0]
    if limit is None:
        size, why = per_rank, "no device memory to plan for (a CPU run, hardware.device_memory_gb unset)"
    else:
        try:
            size = auto_microbatch(config, limit)
        except ConfigError as error:
            raise ConfigError(
                f"bad value for 'device_train_microbatch_size': auto under parallel=fsdp is decided by trainrun "
                f"estimate, which refuses this run ({error}); give the micro-batch size"
            ) from None
        if size is None:
            raise ConfigError(
                f"bad value for 'device_train_microbatch_size': auto under parallel=fsdp: not even one sample a pass "
                f"fits {limit:.0f} GB a device (trainrun estimate); use more ranks or activation checkpointing"
            )
        why = f"the largest that fits {limit:.0f} GB a device (trainrun estimate)"
    print(f"trainrun: note: device_train_microbatch_size=auto under parallel=fsdp: {size} ({why})", file=sys.stderr)
    return dataclasses.replace(config, device_train_microbatch_size=str(size))


def launch(config: TrainConfig, run_dir: Path, config_yaml: str, debug: bool = False) -> None:
    """Train ``config`` in ``run_dir`` on every device this launch asks for."""
    from trainrun.run import train

    settings = config.launcher
    tolerant = settings.fault_tolerance == "replicas"  # one trainrun a node, which starts the node's ranks
    if tolerant:
        config = dataclasses.replace(config, launcher=replica_groups.placed_by_slurm(settings))
        settings = config.launcher
    started_elsewhere = "WORLD_SIZE" in os.environ or (not tolerant and adopt_slurm_environment(settings))
    processes = device_count(settings.devices)
    ranks = int(os.environ["WORLD_SIZE"]) if started_elsewhere else processes * settings.nnodes
    resume_path = checkpoint.resolve_resume(config.resume, checkpoint.directory(run_dir))
    if resume_path is not None:  # any number of ranks that divides the checkpoint's global batch
        checkpoint.check_topology(
            checkpoint.load_checkpoint(resume_path, mmap=True), config.train_batch_size, ranks, resume_path
        )
        checkpoint.check_readable(resume_path, config.parallel.name == "fsdp" and ranks > 1, ranks)
    if config.model.weights and (Path(config.model.weights).expanduser() / ".metadata").is_file():
        from trainrun.models.weights import sharded_files_whole

        sharded_files_whole(Path(config.model.weights).expanduser())  # one line, before any worker starts
    check_float8(config.precision, config.device)
    if not started_elsewhere:
        check_gpus_for(processes, config.device)
    check_batch_split(config.train_batch_size, config.eval_batch_size, ranks)  # before any worker starts
    check_microbatch_size(config.device_train_microbatch_size, config.train_batch_size, ranks)
    if config.parallel.name == "fsdp" and config.device_train_microbatch_size == "auto":
        config = microbatch_before_start(config)
    if tolerant:
        replica_groups.check(config, started_elsewhere)
        launch_replica_group(config, run_dir, config_yaml, debug, processes)
        return
    route = route_between_nodes(settings, started_elsewhere)
    environment = {} if route is None else node_environment(route)
    if started_elsewhere or (processes == 1 and settings.nnodes == 1):
        os.environ.update(environment)
        train(config, run_dir, config_yaml)
    else:
        run_workers(
            settings, processes, train_worker, config, str(run_dir), config_yaml, debug, environment,
            show_failure_logs=debug, route=route,
        )  # fmt: skip


# NCCL's watchdog on a failed or timed-out collective: abort the communicator and raise in the training
# thread (2, CleanUpOnly), rather than end the process (torch's default), so that the heartbeat names a
# lost node before a rank ends on NCCL's error
NCCL_ERRORS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


def node_environment(route: Route) -> dict[str, str]:
    """What the ranks of a run across nodes are told: gloo's interface (the route's), this node's
    address for the heartbeat, and how NCCL's errors surface (:data:`NCCL_ERRORS`); what the user set
    is left as set."""
    told = route.environment() | {heartbeat.NODE_ADDRESS: route.local_address}
    return told | {name: value for name, value in NCCL_ERRORS.items() if name not in os.environ}


def route_between_nodes(settings: LauncherConfig, started_elsewhere: bool) -> Route | None:
    """For ranks across nodes, the interface that reaches the master: ``master_addr`` or the
    rendezvous endpoint's host for trainrun's launch (said in one line), ``MASTER_ADDR`` for ranks
    torchrun or a Slurm step started; None on one node."""
    if started_elsewhere:
        if nodes_from_environment() < 2:
            return None
        route = route_to(os.environ["MASTER_ADDR"], "MASTER_ADDR", hosts_master=os.environ.get("GROUP_RANK") == "0")
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one line a node
            where = f"node {os.environ.get('GROUP_RANK', '?')} of {nodes_from_environment()}"
            print(f"trainrun: {where}: {route.describe()}", file=sys.stderr, flush=True)
        return route
    if settings.nnodes < 2:
        return None
    key, host = "launcher.master_addr", settings.master_addr
    if settings.rdzv_endpoint:
        key, host = "launcher.rdzv_endpoint", settings.rdzv_endpoint.rsplit(":", 1)[0].strip("[]")
    route = route_to(host, key, hosts_master=bool(settings.rdzv_endpoint) or settings.node_rank == 0)
    where = f"node {settings.node_rank} of {settings.nnodes}" if not settings.rdzv_endpoint else "this node"
    print(f"trainrun: {where}: {route.describe()}", file=sys.stderr, flush=True)
    return route


def launch_replica_group(config: TrainConfig, run_dir: Path, config_yaml: str, debug: bool, processes: int) -> None:
    """This node as one replica group of a fault-tolerant run (core/replicas.py): its ranks start as a
    group of their own (a rendezvous at this node's address, whose store the other nodes reach for the
    exchange between groups); node 0 starts the lighthouse unless ``launcher.lighthouse`` names one."""
    settings = config.launcher
    host, port, key = replica_groups.lighthouse_of(settings)
    starts_lighthouse = settings.lighthouse is None and settings.node_rank == 0
    route = route_to(host, key, hosts_master=starts_lighthouse)
    print(f"trainrun: node {settings.node_rank} of {settings.nnodes}: {route.describe()}", file=sys.stderr, flush=True)
    lighthouse = replica_groups.start_lighthouse(port) if starts_lighthouse else None
    store = replica_groups.start_store(port) if starts_lighthouse else None
    local = dataclasses.replace(
        settings, nnodes=1, node_rank=0, master_addr=route.local_address, master_port=free_port(), rdzv_endpoint=None
    )
    if config.resume is None and not under_way(f"{host}:{port + 1}", settings.rendezvous_timeout):
        run_files.check_no_earlier_run(str(run_dir))  # a fresh run; a node that joins one finds its folder in use
    environment = node_environment(route) | {
        REPLICA: str(settings.node_rank),
        REPLICAS: str(settings.nnodes),
        REPLICA_TIMEOUT: str(settings.replica_timeout),
        "TORCHFT_LIGHTHOUSE": f"http://{host}:{port}",
        START_STORE: f"{host}:{port + 1}",
        "RUST_LOG": os.environ.get("RUST_LOG", "warn"),  # torchft's quorum lines, every step: RUST_LOG=info
    }
    try:
        run_workers(
            local, processes, train_worker, config, str(run_dir), config_yaml, debug, environment,
            show_failure_logs=debug,
        )  # fmt: skip
    finally:
        if lighthouse is not None:
            lighthouse.shutdown()
        del store
