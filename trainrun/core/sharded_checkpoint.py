"""Sharded checkpoints (``parallel=fsdp``): each rank writes its own shards with
``torch.distributed.checkpoint`` (DCP), and a checkpoint loads on any number of ranks.

A checkpoint is a folder ``ep{E}-ba{B}/`` beside the one-file checkpoints: DCP's files for the
model and the optimizer (a ``__R_0.distcp`` per rank and ``.metadata``) and ``trainer.pt``, rank 0's
one-file payload of everything else (progress, schedule, time accounts, the algorithms' state).
It is written as ``.ep{E}-ba{B}.partial/`` and renamed once every rank's files and ``trainer.pt``
are complete, so a killed run leaves either the whole checkpoint or none. Loading reads each
rank's part of every weight from whichever files hold it (DCP reshards): 2 ranks' checkpoint
continues on 1, 4 or under DDP. Under ``checkpoint.async_save`` the ranks copy their shards to
host memory (pinned, on a GPU) and train on while a thread writes them (through a process group of
its own); rank 0 completes the checkpoint (``trainer.pt``, the rename) as soon as DCP's metadata is
written, which is after every rank's shards are, so a crash after that point keeps it.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from trainrun.core import checkpoint, distributed
from trainrun.errors import CheckpointError


@contextlib.contextmanager
def single_process_quiet() -> Iterator[None]:
    """DCP without a process group (one rank, or a command reading a checkpoint) says it assumes one
    process at every call: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (load|save) in a single process")
        yield


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What DCP saves and loads of a rank: its model's and optimizer's state, by weight name
    (its shards under FSDP2)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def read_whole(path: Path, keys: set[str]) -> dict[str, Any]:
    """The entries ``keys`` of checkpoint ``path``, whole, in this process (no process group)."""
    with single_process_quiet():
        return _load_state_dict_from_keys(keys, checkpoint_id=path)


def partial_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


@dataclass
class PendingSave:
    """A checkpoint whose shards are being written. Rank 0 completes it (:meth:`complete`) when its
    write ends, every rank's shards being on disk by then; :meth:`finish` waits for that on every rank."""

    path: Path
    payload: dict[str, Any]
    written: Future | None  # None: already written
    is_main: bool
    world_size: int
    keep: int
    completed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def complete_when_written(self) -> None:
        """Rank 0: complete the checkpoint from the writer's thread as soon as its write ends (a
        failed write is raised by :meth:`finish`)."""
        if self.is_main and self.written is not None:
            self.written.add_done_callback(self._complete_if_written)

    def _complete_if_written(self, written: Future) -> None:
        if written.exception() is None:
            self.complete()

    def complete(self) -> None:
        """Rank 0 writes ``trainer.pt`` into the written shards' folder and renames it (once)."""
        with self._lock:
            if self.completed:
                return
            partial = partial_path(self.path)
            checkpoint.atomic_torch_save(self.payload, partial / checkpoint.TRAINER_FILE)
            shutil.rmtree(self.path, ignore_errors=True)
            partial.rename(self.path)
            checkpoint.prune(self.path.parent, self.keep)
            self.completed = True

    def finish(self) -> None:
        """Wait for every rank's shards and for the checkpoint's completion (raising a write's error)."""
        if self.written is not None:
            self.written.result()
        distributed.wait_for_all(self.world_size)
        if self.is_main:
            self.complete()
        distributed.wait_for_all(self.world_size)


class ShardedCheckpoints:
    """Writes a run's sharded checkpoints (one at a time: the next waits for the last)."""

    def __init__(self, is_main: bool, world_size: int, keep: int, asynchronous: bool, on_gpu: bool = False) -> None:
        self.is_main, self.world_size, self.keep, self.asynchronous = is_main, world_size, keep, asynchronous
        self.pending: PendingSave | None = None
        self._group = None  # the background writer's own process group: training's collectives go on beside it
        self._stager = pinned_stager() if asynchronous and on_gpu else None

    def save(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, payload: dict[str, Any]) -> None:
        """Write ``model``'s and ``optimizer``'s shards and ``payload`` as the checkpoint ``path``."""
        self.finish()
        partial = partial_path(path)
        if self.is_main:
            shutil.rmtree(partial, ignore_errors=True)  # a killed run's unfinished write
            partial.mkdir(parents=True)
        distributed.wait_for_all(self.world_size)
        state, written = training_state(model, optimizer), None
        if self.asynchronous and self.world_size > 1:
            if self._group is None:
                self._group = dist.new_group(backend="gloo")
            staging = {"async_stager": self._stager} if self._stager is not None else {}
            written = dcp.async_save(state, checkpoint_id=partial, process_group=self._group, **staging)
        else:
            with single_process_quiet():
                dcp.save(state, checkpoint_id=partial, no_dist=self.world_size == 1)
        self.pending = PendingSave(path, payload, written, self.is_main, self.world_size, self.keep)
        if written is None:
            self.finish()
        else:
            self.pending.complete_when_written()

    def finish(self) -> None:
        """Complete the checkpoint being written, if any."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.finish()


def pinned_stager() -> Any:
    """DCP's stager copying a GPU's shards into pinned host buffers, reused from save to save (the
    copy is done before training goes on; the write runs behind it); None where this torch has none."""
    staging = getattr(dcp, "staging", None)
    if staging is None or not hasattr(staging, "DefaultStager"):
        return None
    options = staging.StagingOptions(
        use_pinned_memory=True, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=True
    )
    return staging.DefaultStager(options)


def load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world_size: int) -> None:
    """Load the weights and optimizer state of checkpoint ``path`` into this rank's ``model`` and
    ``optimizer`` (sharded or whole), whatever number of ranks wrote it."""
    state = training_state(model, optimizer)
    try:
        with single_process_quiet():
            dcp.load(state, checkpoint_id=path, no_dist=world_size == 1)
    except Exception as error:  # DCP raises a CheckpointException naming each rank's failure
        first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"checkpoint '{path}' does not load into this run's model: {first}; resume with the model settings it "
            "was trained with (its run's config.yaml)"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_whole(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict, optimizer_state: dict) -> None:
    """Load a one-file checkpoint's state: its optimizer state as ``optimizer.state_dict()`` gives it
    (by parameter index), or by weight name as :func:`one_file` writes it."""
    if any(isinstance(key, str) for key in optimizer_state.get("state", {})):
        set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optimizer_state)
    else:
        model.load_state_dict(weights)
        optimizer.load_state_dict(optimizer_state)


def whole_weights(path: Path) -> dict[str, torch.Tensor]:
    """Checkpoint ``path``'s model weights, whole, in this process (no process group)."""
    return read_whole(path, {"model"})["model"]


def one_file(path: Path, with_optimizer: bool = True) -> dict[str, Any]:
    """Checkpoint ``path`` as a one-file checkpoint's payload: its ``trainer.pt`` with the whole
    weights and (``with_optimizer``) the optimizer state, keyed by weight name as DCP keeps it."""
    payload = checkpoint.load_checkpoint(path)
    state = read_whole(path, {"model", "optimizer"} if with_optimizer else {"model"})
    return payload | {"model": state["model"], "optimizer": state.get("optimizer")}
