"""Child trainrun processes (a profile of ``recipe=auto``, a run of a sweep) that end with their parent.

CI runners and schedulers often kill only the process they started; a child left behind would
train on, holding the machine, to the end of its run. On Linux each child asks the kernel for
SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``); trainrun stops on SIGTERM as on
Ctrl-C (its own ranks included). Python has no wrapper for that call, hence ctypes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


def _end_with_parent(parent: int) -> None:
    """In the forked child, before exec: SIGTERM when ``parent`` exits (and now, if it already has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died between fork and prctl
        os.kill(os.getpid(), signal.SIGTERM)


def run_trainrun(arguments: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``python -m trainrun ARGUMENTS`` in a child that ends when this process ends."""
    parent = os.getpid()
    end = (lambda: _end_with_parent(parent)) if sys.platform == "linux" else None
    return subprocess.run([sys.executable, "-m", "trainrun", *arguments], preexec_fn=end, **kwargs)
