"""One rank's place in the run: its device, its process group, and its share of per-rank state.

The process group gets a backend for each device type the run moves tensors of: NCCL for CUDA
tensors and gloo beside it for CPU ones (object collectives, CPU-side figures), so no collective
fails with "No backend type associated with device type cpu". A CPU run uses gloo alone, even
on a machine with GPUs. The device is chosen (``torch.cuda.set_device``) before the group starts,
and the group is told it (``device_id``), so its first barrier uses this rank's GPU rather than
guessing ``rank % GPUs``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  (before any group exists: see leave)
from torch.nn.parallel import DistributedDataParallel

from trainrun.errors import ConfigError

REPLICA, REPLICAS = "TRAINRUN_REPLICA", "TRAINRUN_REPLICAS"  # launcher.fault_tolerance=replicas: see Placement
REPLICA_TIMEOUT = "TRAINRUN_REPLICA_TIMEOUT"  # launcher.replica_timeout, as the launcher tells the ranks


@dataclass(frozen=True)
class Placement:
    """Where this process is: its rank in its process group, the group's ranks, its rank on this node.

    Under ``launcher.fault_tolerance=replicas`` the group is one node's (core/replicas.py), one of
    ``replicas`` planned replica groups; the run's data is divided among every group's ranks.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    replica: int = 0
    replicas: int = 1

    @classmethod
    def from_environment(cls) -> Placement:
        """From torch.distributed's variables (set by the launcher, torchrun or Slurm adoption)."""
        env = os.environ
        group = (int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")))
        return cls(*group, int(env.get(REPLICA, "0")), int(env.get(REPLICAS, "1")))

    @property
    def is_main(self) -> bool:
        """The run's first rank, which owns the console and every file."""
        return self.rank == 0 and self.replica == 0

    @property
    def data_rank(self) -> int:
        """This rank's share of each step's samples among :attr:`data_ranks`."""
        return self.replica * self.world_size + self.rank

    @property
    def data_ranks(self) -> int:
        """The shares each step's samples are divided into: every planned rank's."""
        return self.replicas * self.world_size

    def of_replica(self, replica: int) -> Placement:
        """This rank's counterpart in replica group ``replica``."""
        return dataclasses.replace(self, replica=replica)


SINGLE_PROCESS = Placement()


def nodes_from_environment() -> int:
    """How many nodes the ranks span, as the launcher says it (``GROUP_WORLD_SIZE``: trainrun's and
    torchrun's, and a Slurm step's once trainrun translates it); 1 where nothing says."""
    return int(os.environ.get("GROUP_WORLD_SIZE") or "1")


PEER_LOSS_SIGNS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator")


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank went away."""
    text = str(error)
    return isinstance(error, dist.DistError) or any(sign in text for sign in PEER_LOSS_SIGNS)


def cores_per_process(processes: int | None = None) -> int:
    """The cores this process may use, shared among ``processes`` (default: the training processes
    of its node, ``LOCAL_WORLD_SIZE``, which torchrun and trainrun's launcher set): a rank's torch
    threads, the loader workers to start."""
    processes = processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, len(os.sched_getaffinity(0)) // processes)


def backend_for(device: torch.device) -> str:
    """The process-group backend for a run on ``device``."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def cuda_index(local_rank: int) -> int:
    """This local rank's GPU among the GPUs the process sees.

    Its own index when the process sees every GPU of the node; 0 when it sees exactly one, as
    under Slurm's ``--gpus-per-task=1`` or a per-rank ``CUDA_VISIBLE_DEVICES``.
    """
    visible = torch.cuda.device_count()
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    raise ConfigError(
        f"local rank {local_rank} has no GPU: this process sees {visible} GPU(s) "
        "(start at most one process per visible GPU, or give each process its own with --gpus-per-task=1)"
    )


def check_gpus_for(processes: int, device_name: str) -> None:
    """Refuse, before any process starts, more ranks on this node than it has GPUs: each would take
    GPU 0 and NCCL stops them all ("Duplicate GPU detected")."""
    if processes < 2 or device_name == "cpu" or not torch.cuda.is_available():
        return
    visible = torch.cuda.device_count()
    if processes > visible:
        raise ConfigError(
            f"bad value for 'launcher.devices': {processes} ranks on this node, which has {visible} GPU(s); "
            f"NCCL runs one rank per GPU (launcher.devices={visible}, or device=cpu for ranks on the CPU)"
        )


def select_device(name: str, local_rank: int, deterministic: bool = False) -> torch.device:
    """The device for ``device=name`` (auto, cpu, cuda), made current; cuDNN autotuning on for CUDA
    unless ``deterministic`` asks for torch's deterministic kernels (slower on a GPU)."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.use_deterministic_algorithms(True, warn_only=True)  # ops with no such kernel warn, by name
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available")
    device = torch.device("cuda", cuda_index(local_rank))
    torch.cuda.set_device(device)
    # Fixed shapes per step: cuDNN picks the fastest convolution algorithm once per shape.
    torch.backends.cudnn.benchmark = not deterministic
    return device


def join(device_name: str, deterministic: bool = False, timeout_minutes: float = 60) -> tuple[Placement, torch.device]:
    """This process's placement and device; joins the process group when there are several ranks.

    ``timeout_minutes`` bounds every collective, NCCL's and gloo's alike (NCCL's own default is
    10 minutes, less than rank 0 may need to write a multi-gigabyte checkpoint).
    """
    placement = Placement.from_environment()
    device = select_device(device_name, placement.local_rank, deterministic)
    if placement.world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend_for(device),
            device_id=device if device.type == "cuda" else None,
            timeout=timedelta(minutes=timeout_minutes),
        )
    return placement, device


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` without its DDP wrapper, which holds the process group: see :func:`leave`."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def leave() -> None:
    """Destroy the process group, ending its gloo worker threads here rather than at interpreter exit.

    A worker that drops its last collective's tensors after Python began finalising aborts the
    process ("terminate called without an active exception"). The group ends only with its last
    reference: the caller drops the DDP wrapper first (:func:`unwrapped`), and this module imports
    ``torch.distributed.nn.functional`` before any group exists, since that module's functions
    take the group of the moment as their default argument when first imported (torch._dynamo
    imports it).
    """
    if dist.is_initialized():
        dist.destroy_process_group()


def wait_for_all(world_size: int) -> None:
    """A barrier on the gloo side of the group (a CPU all-reduce): ranks waiting here, for rank 0's
    checkpoint write say, hold no NCCL collective open for NCCL's watchdog to time out."""
    if world_size > 1:
        dist.all_reduce(torch.zeros(1))


def firsts_on_any_rank(values: list[int | None], world_size: int) -> list[int | None]:
    """For each of ``values``, the smallest of every rank's (None: none on that rank), the same on
    every rank: several decisions in one collective.

    A CPU tensor through gloo, so deciding together reads nothing back from a device.
    """
    if world_size == 1:
        return values
    empty = torch.iinfo(torch.int64).max
    found = torch.tensor([empty if value is None else value for value in values], dtype=torch.int64)
    dist.all_reduce(found, op=dist.ReduceOp.MIN)
    return [None if int(value) == empty else int(value) for value in found]


def gathered(items: list[str], world_size: int) -> list[str]:
    """Every rank's ``items`` together, sorted, once each, the same on every rank."""
    if world_size == 1:
        return sorted(set(items))
    every: list[list[str] | None] = [None] * world_size
    dist.all_gather_object(every, items)
    return sorted({item for rank_items in every for item in rank_items or []})


def average_buffers(module: torch.nn.Module, world_size: int) -> None:
    """Average ``module``'s floating-point buffers (batch-norm running statistics) over the ranks,
    as timm's ``distribute_bn(reduce=True)``: each rank updated its own from its own batches."""
    buffers = [buffer for buffer in module.buffers() if buffer.is_floating_point()]
    if world_size == 1 or not buffers:
        return
    flat = torch._utils._flatten_dense_tensors(buffers)
    dist.all_reduce(flat)
    flat /= world_size
    torch._foreach_copy_(buffers, torch._utils._unflatten_dense_tensors(flat, buffers))


def record_failure(line: str) -> None:
    """Hand a rank's one-line error to the launching process in torch elastic's error file."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path is None:
        print(f"trainrun: error: {line}", file=sys.stderr)
        return
    Path(path).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))
