"""Built-in data written once into ``data.cache_dir``, named by everything that decides its content.

Each node's local rank 0 writes what is missing (atomically: a shared filesystem may see identical
copies from several nodes, the last complete one wins) while the other ranks wait for it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainrun.core.distributed import Placement


def cache_prefix(cache_dir: str, name: str, identity: dict[str, Any]) -> Path:
    """``cache_dir/<name>-<digest of identity>``, the stem of the cached files."""
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache_dir).expanduser() / f"{name}-{digest}"


def write_once_per_node(done: Callable[[], bool], write: Callable[[], None], placement: Placement) -> None:
    """``write()`` on each node's local rank 0 unless ``done()``; every rank returns once it is written."""
    if placement.local_rank == 0 and not done():
        write()
    if placement.world_size > 1:
        dist.barrier()
