"""Stopping for a scheduler that is about to stop the job: ``SIGUSR1`` (Slurm's
``#SBATCH --signal=USR1@SECONDS`` before the time limit, ``scancel --signal=USR1 JOB``) asks a run
to write a checkpoint and end; under Slurm rank 0 then requeues its job (``scontrol requeue``,
unless ``launcher.requeue=false``), which starts again and continues with ``resume=auto``, as
Lightning's Slurm auto-requeue does.

Each rank notes the signal when it comes; the ranks decide together at the next loss check (every
``log_interval`` steps, where they already agree on divergence), so every rank stops at the same
step. The run's summary says ``preempted`` and trainrun exits 75 (:class:`trainrun.errors.RunPreempted`);
rank 0 of a requeued job waits for Slurm to end the job (at most :data:`REQUEUE_WAIT_SECONDS`), so
that the job is still running when it is requeued rather than ending first, which Slurm would record
as the job's end. A process that only launches ranks ignores the signal: Slurm signals every process of
the job step, the ranks among them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

SIGNAL = signal.SIGUSR1
STATUS = "preempted"  # summary.json's status and State.stop_reason
REQUEUE_WAIT_SECONDS = 120  # rank 0's wait, after requeueing, for Slurm to end the job (its KillWait is 30 s)


class PreemptionSignal:
    """Whether :data:`SIGNAL` has come since :meth:`listen` (always False off the main thread)."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None

    def listen(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(SIGNAL, self._note)

    def _note(self, number: int, frame: Any) -> None:
        self.received = True

    def stop_listening(self) -> None:
        if self._previous is not None:
            signal.signal(SIGNAL, self._previous)
            self._previous = None


def ignore_in_launcher() -> None:
    """The launching process outlives the signal (its default would end it); the ranks act on it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(SIGNAL, signal.SIG_IGN)


def requeue_slurm_job(wait: bool = True, timeout: float = 60) -> str | None:
    """``scontrol requeue`` of this Slurm job (``SLURM_JOB_ID``): what was done, in words; None off
    Slurm. ``wait``: then wait for Slurm to end the job (a preempted run, whose job must still be
    running when it is requeued); a run that lost a node ends at once instead."""
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        return None
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"could not requeue Slurm job {job} ({error}): requeue it by hand, then resume=auto continues"
    if result.returncode != 0:
        why = (result.stderr or result.stdout).strip().splitlines()
        return f"could not requeue Slurm job {job} ({why[0] if why else result.returncode}): requeue it by hand"
    print(f"trainrun: requeued Slurm job {job}: it starts again and resume=auto continues", file=sys.stderr, flush=True)
    if not wait:
        return f"requeued Slurm job {job}"
    time.sleep(REQUEUE_WAIT_SECONDS)  # Slurm ends the job meanwhile
    return f"requeued Slurm job {job}, which did not end within {REQUEUE_WAIT_SECONDS} s"
