"""Atomic checkpoint files: write to a temporary name, then rename; read with ``weights_only``."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from trainrun.atomic_io import atomic_write
from trainrun.errors import CheckpointError

FORMAT = "trainrun/1"  # a checkpoint payload's "format"
_NAME = re.compile(r"^ep(\d+)-ba(\d+)\.pt$")


def checkpoint_name(epoch: int, batch: int) -> str:
    return f"ep{epoch}-ba{batch}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in ``directory``, oldest (fewest batches) first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(2)), path) for path in directory.iterdir() if (m := _NAME.match(path.name))]
    return [path for _, path in sorted(found)]


def atomic_torch_save(payload: dict[str, Any], path: Path) -> None:
    """Write ``payload`` so that ``path`` is either absent, the old file, or the complete new one.

    A write the file system refuses (disk full, quota, file size limit) raises its ``OSError``:
    torch's zip writer would report it as a RuntimeError about a file position.
    """

    def save(handle: BinaryIO) -> None:
        writer = _FailureRecordingWriter(handle)
        try:
            torch.save(payload, writer)
        except RuntimeError:
            if writer.failure is not None:
                raise writer.failure from None
            raise

    atomic_write(path, save)


class _FailureRecordingWriter:
    """A binary handle that remembers the ``OSError`` its last failed write raised."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.failure = handle, None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.failure = error
            raise

    def flush(self) -> None:
        self.handle.flush()


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`atomic_torch_save`, tensors on the CPU."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for damaged files
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"checkpoint '{path}' is corrupt or not a trainrun checkpoint: {reason}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint '{path}' is not a trainrun checkpoint")
    return payload


def rng_state() -> dict[str, Any]:
    """This process's random states (Python, NumPy, torch CPU and its own GPU's) in a ``weights_only`` form.

    Only the current GPU's state is kept: the run draws on no other, and a resume may see another
    set of GPUs (a rank of 8 on a node, then a lone process on one GPU).
    """
    numpy_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "python": random.getstate(),
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].copy()), *numpy_state[2:]],
    }


def restore_rng_state(saved: dict[str, Any]) -> None:
    """Continue the random streams :func:`rng_state` recorded."""
    torch.set_rng_state(saved["torch"])
    if isinstance(saved["cuda"], torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["cuda"])  # the current device's
    random.setstate(saved["python"])
    name, keys, *rest = saved["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))


def rank_rng_state(saved: dict[str, Any] | list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
    """Rank ``rank``'s entry of a checkpoint's per-rank random states (one dict: a one-rank run's)."""
    per_rank = saved if isinstance(saved, list) else [saved]
    if len(per_rank) != world_size:
        raise CheckpointError(
            f"the checkpoint holds the random state of {len(per_rank)} rank(s) and this run has {world_size}: "
            f"resume with {len(per_rank)} process(es)"
        )
    return per_rank[rank]


def resolve_resume(resume: str | None, checkpoint_dir: Path) -> Path | None:
    """The checkpoint to resume from: ``auto`` = the newest in ``checkpoint_dir`` (or none)."""
    if resume is None:
        return None
    if resume == "auto":
        found = list_checkpoints(checkpoint_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist (resume={resume})")
    return path


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints."""
    for path in list_checkpoints(directory)[:-keep]:
        path.unlink(missing_ok=True)
