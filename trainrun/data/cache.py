"""Built-in data written once into ``data.cache_dir``, named by everything that decides its content.

Each node's local rank 0 writes what is missing (atomically: a shared filesystem may see identical
copies from several nodes, the last complete one wins) while the other ranks wait for it. Runs that
start together on one machine with a cold cache (a sweep's processes, parallel test workers) take
turns through a lock file beside the data, so each set is written once and never replaced under a
run that already reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainrun.core.distributed import Placement


def cache_prefix(cache_dir: str, name: str, identity: dict[str, Any]) -> Path:
    """``cache_dir/<name>-<digest of identity>``, the stem of the cached files."""
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache_dir).expanduser() / f"{name}-{digest}"


@contextlib.contextmanager
def exclusive(prefix: Path) -> Iterator[None]:
    """Hold ``<prefix>.lock`` against every other process of this machine until the block ends."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.with_name(f"{prefix.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes, even on an error
        yield


def write_once(prefix: Path, done: Callable[[], bool], write: Callable[[], None]) -> None:
    """``write()`` unless ``done()``, checked again under the lock of ``prefix``: when two processes
    find the data missing, the second waits for the first and then finds it written."""
    if done():
        return
    with exclusive(prefix):
        if not done():
            write()


def write_once_per_node(
    prefix: Path, done: Callable[[], bool], write: Callable[[], None], placement: Placement
) -> None:
    """:func:`write_once` on each node's local rank 0; every rank returns once it is written."""
    if placement.local_rank == 0:
        write_once(prefix, done, write)
    if placement.world_size > 1:
        dist.barrier()
