"""What produced a run, recorded in its ``summary.json`` as MLPerf results record it.

trainrun's version and the git commit of its checkout (with a ``dirty`` flag when the working
tree differs from it), the versions of torch, torchvision and ffcv and of CUDA, the device and
how many train, the command line as the user typed it (the CLI records it before any worker
process starts, so every rank reports the same one), and every installed package's version.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trainrun

if TYPE_CHECKING:  # the CLI records the command through this module before torch is imported
    import torch

COMMAND_VARIABLE = "TRAINRUN_COMMAND"


def record_command(argv: list[str]) -> None:
    """Remember the command line for this process and the workers it starts. Always replaced:
    the runs of a sweep are ``trainrun`` processes that inherit the sweep's environment."""
    os.environ[COMMAND_VARIABLE] = shlex.join(["trainrun", *argv])


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    source = Path(trainrun.__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def provenance(
    device: torch.device, world_size: int, model: torch.nn.Module | None = None, replicas: int = 1
) -> dict[str, Any]:
    """Everything needed to trace a figure back to what made it (the nodes as the launcher says them;
    the file that defines ``model``'s class, a module of the user's own among them, and its hash)."""
    import torch

    from trainrun.core.checkpoint import model_source
    from trainrun.core.distributed import nodes_from_environment

    commit = _git("rev-parse", "HEAD")
    return {
        "trainrun": trainrun.__version__,
        "git_commit": commit,
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "ffcv": _version("ffcv"),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "devices": world_size,
        "nodes": replicas if replicas > 1 else nodes_from_environment(),  # fault_tolerance=replicas: its nodes
        "command": os.environ.get(COMMAND_VARIABLE, shlex.join(sys.argv)),
        "model_source": model_source(model) if model is not None else None,
        "packages": package_versions(),
    }


def package_versions() -> list[str]:
    """Every installed distribution as ``name==version``, sorted, as ``pip freeze`` writes them:
    enough to rebuild the environment that produced a run."""
    found = {
        dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions() if dist.metadata["Name"]
    }
    return [f"{name}=={found[name]}" for name in sorted(found, key=str.lower)]
