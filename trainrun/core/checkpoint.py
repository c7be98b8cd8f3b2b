"""Atomic checkpoint files: write to a temporary name, then rename; read with ``weights_only``.

A checkpoint is one file ``ep{E}-ba{B}.pt`` (``parallel=ddp``) or a folder ``ep{E}-ba{B}/`` of
shards (``parallel=fsdp``: :mod:`trainrun.core.sharded_checkpoint`) whose ``trainer.pt`` holds the
same payload less the weights and the optimizer state.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, BinaryIO

import torch

from trainrun import run_files
from trainrun.atomic_io import atomic_write
from trainrun.errors import CheckpointError

FORMAT = "trainrun/1"  # a checkpoint payload's "format"
_NAME = re.compile(r"^ep(\d+)-ba(\d+)(\.pt)?$")
TRAINER_FILE = "trainer.pt"  # a sharded checkpoint's payload less the weights and optimizer state


def directory(run_dir: Path) -> Path:
    """Where a run keeps its checkpoints."""
    return run_dir / run_files.CHECKPOINTS


def model_source(model: torch.nn.Module) -> dict[str, str] | None:
    """The file that defines ``model``'s class and its SHA-256 (a module of the user's own, timm's
    architecture, trainrun's): what a run's provenance and checkpoints record of the code it trains."""
    import hashlib
    import inspect

    try:
        path = Path(inspect.getsourcefile(type(model)) or "")
    except TypeError:  # a class defined outside any file
        return None
    if not path.is_file():
        return None
    return {"file": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def changed_source(saved: dict[str, str] | None, now: dict[str, str] | None) -> str | None:
    """One line where the file that defines the model's class (``now``: :func:`model_source`) differs
    from the one a checkpoint saved."""
    if not saved or not now or saved == now:
        return None
    if saved["file"] != now["file"]:
        return (
            f"the model's class is now defined in {now['file']}, not {saved['file']} as when the checkpoint was written"
        )
    hashes = f"sha256 {saved['sha256'][:12]} -> {now['sha256'][:12]}"
    return f"{now['file']} has changed since the checkpoint was written ({hashes})"


def checkpoint_name(epoch: int, batch: int, sharded: bool = False) -> str:
    return f"ep{epoch}-ba{batch}" + ("" if sharded else ".pt")


def is_sharded(path: Path) -> bool:
    """Whether checkpoint ``path`` is a folder of shards."""
    return path.is_dir()


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


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by :func:`atomic_torch_save`, tensors on the CPU (``mmap``: read
    from the file only when used, so a launcher checks a large checkpoint's entries in milliseconds);
    of a sharded checkpoint, its ``trainer.pt``."""
    if path.is_dir():
        if not (path / ".metadata").is_file() or not (path / TRAINER_FILE).is_file():
            raise CheckpointError(
                f"checkpoint '{path}' is not a sharded trainrun checkpoint (no .metadata and {TRAINER_FILE})"
            )
        check_shard_files(path)
        path = path / TRAINER_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # torch raises many types for damaged files
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt or not a trainrun checkpoint: {load_failure(error)}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint '{path}' is not a trainrun checkpoint")
    return payload


def check_shard_files(path: Path) -> None:
    """A sharded checkpoint's ``.metadata`` reads and every shard file it names is there, whole (the
    bytes each entry ends at): one line naming the damaged or missing file, before anything loads."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        storage = FileSystemReader(path).read_metadata().storage_data
    except Exception as error:  # a damaged pickle raises anything
        raise CheckpointError(
            f"checkpoint '{path / '.metadata'}' is damaged (DCP cannot read it: {type(error).__name__}); the "
            "checkpoint is unusable: resume from another (checkpoints/) or retrain"
        ) from None
    needed: dict[str, int] = {}
    for info in storage.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        shard = path / name
        if not shard.is_file():
            raise CheckpointError(f"checkpoint '{path}' is incomplete: '{shard}' is missing (its .metadata names it)")
        if shard.stat().st_size < size:
            raise CheckpointError(
                f"checkpoint '{path}' is incomplete: '{shard}' has {shard.stat().st_size:,} bytes, its .metadata "
                f"needs {size:,}"
            )


def load_failure(error: Exception) -> str:
    """What in ``torch.load``'s ``error`` names the problem, in one line (not its advice on
    loading untrusted files without ``weights_only``)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported global" in line or "Unsupported operand" in line]
    if named:
        return named[0].split("error: ", 1)[-1].split(". ")[0]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def check_topology(payload: dict[str, Any], global_batch: int, ranks: int, path: Path | None = None) -> None:
    """A checkpoint continues on ``ranks`` processes when its global batch is this run's and divides
    among them (its own number of ranks does not matter: nothing in it is per rank)."""
    topology = payload.get("topology")
    if topology is None:  # written before checkpoints recorded it
        return
    name = f"checkpoint '{path}'" if path else "the checkpoint"
    saved = topology["global_batch"]
    if saved != global_batch:
        raise CheckpointError(
            f"{name} was trained with a global batch of {saved} (train_batch_size); this run has {global_batch}: "
            f"resume with train_batch_size={saved}"
        )
    if saved % ranks:
        raise CheckpointError(
            f"{name} has a global batch of {saved}, which does not divide among {ranks} processes; resume on a "
            f"number of processes that divides {saved} (it was written by {topology['world_size']})"
        )


def check_readable(path: Path, sharded_run: bool, ranks: int) -> None:
    """A run sharded over several ranks reads sharded checkpoints only (a one-file checkpoint
    continues under DDP or on one rank, which read both)."""
    if sharded_run and not is_sharded(path):
        raise CheckpointError(
            f"checkpoint '{path}' is one file, which a run sharded over {ranks} ranks does not read: "
            "resume it with parallel=ddp (or on one rank)"
        )


def check_model_shapes(expected: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    """The checkpoint's weights are those of this run's model: the same names and shapes, or one
    line saying the first that differs and from what (resume with the config it was written with)."""
    differing = [name for name in expected if name in saved and saved[name].shape != expected[name].shape]
    missing, extra = [name for name in expected if name not in saved], [name for name in saved if name not in expected]
    if not (differing or missing or extra):
        return
    if differing:
        name = differing[0]
        first = f"'{name}' is {list(saved[name].shape)} there and {list(expected[name].shape)} in this run's model"
    else:
        first = f"it lacks '{missing[0]}'" if missing else f"it has '{extra[0]}', which this run's model has not"
    more = len(differing) + len(missing) + len(extra) - 1
    raise CheckpointError(
        f"the checkpoint holds another model than this run's: {first}"
        + (f" ({more} more differ)" if more else "")
        + "; resume with the model settings it was trained with (its run's config.yaml)"
    )


def resolve_resume(resume: str | None, checkpoint_dir: Path) -> Path | None:
    """The checkpoint to resume from: ``auto`` = the newest in ``checkpoint_dir`` (or none)."""
    if resume is None:
        return None
    if resume == "auto":
        found = list_checkpoints(checkpoint_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist (resume={resume})")
    return path


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints."""
    for path in list_checkpoints(directory)[:-keep]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
