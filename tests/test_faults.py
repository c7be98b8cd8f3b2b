"""Faults in real processes: a run killed outright and resumed, a rank killed, a scheduler's
signal to one rank, a checkpoint write that fails."""

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, killed_and_resumed, read_metrics, run_here, start_cli, wait_for

from trainrun.core.checkpoint import list_checkpoints, load_checkpoint
from trainrun.errors import RunPreempted

MNIST = ["data=mnist5k", "model.resnet_small.width=8", "train_batch_size=64", "progress=false"]  # 62 steps an epoch


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_result(tmp_path):
    """SIGKILL (no handler runs) after the first mid-epoch checkpoint, then resume=auto."""
    args = [*MNIST, "max_duration=2ep", "checkpoint.interval=10ba"]
    whole, killed, newest = killed_and_resumed(args, tmp_path)
    per_epoch = read_metrics(whole)[0]["batch"]
    assert newest % per_epoch and newest < 2 * per_epoch  # a mid-epoch checkpoint, not the end
    checkpoints = killed / "checkpoints"
    final = f"ep2-ba{2 * per_epoch}.pt"
    a = torch.load(whole / "checkpoints" / final, weights_only=True)["model"]
    b = torch.load(checkpoints / final, weights_only=True)["model"]
    assert all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_killed_rank_stops_the_job_with_one_line_naming_it(tmp_path):
    process = start_cli(*MNIST, "max_duration=50ep", "launcher.devices=2", f"hydra.run.dir={tmp_path}")
    wait_for(lambda: (tmp_path / "metrics.jsonl").is_file(), process)  # both ranks are training

    def alive(pid: int) -> bool:
        stat = Path(f"/proc/{pid}/stat")
        return stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"

    ranks = _ranks_of(process)
    assert len(ranks) == 2
    killed_at = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)  # started second: rank 1
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - killed_at < 30
    assert process.returncode != 0
    deadline = time.monotonic() + 5  # the other rank stopped too (its exit reaped by init, if orphaned)
    while any(alive(rank) for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(rank) for rank in ranks)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr  # torch elastic's own failure log stays out
    assert re.fullmatch(r"trainrun: error: rank 1 was killed by SIGKILL; every rank was stopped", lines[0])


def _ranks_of(process: subprocess.Popen) -> list[int]:
    """The ranks of a launch: forked by the launcher's fork server, started in rank order."""
    listing = subprocess.run(["ps", "-ww", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True)
    rows = [line.split(None, 2) for line in listing.stdout.splitlines()]
    servers = {pid for pid, parent, args in rows if int(parent) == process.pid and "forkserver" in args}
    return sorted(int(pid) for pid, parent, _ in rows if parent in servers)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("signalled", [0, 1])
def test_sigusr1_to_one_rank_stops_every_rank_at_one_step_with_exit_75(tmp_path, signalled):
    """``scancel --signal=USR1 --batch`` or a user's ``kill`` reaches one rank, not all: the ranks
    decide together at the next loss check, so both stop at one step, one checkpoint is written, and
    trainrun exits 75 (EX_TEMPFAIL), which a requeueing script reads."""
    process = start_cli(*MNIST, "max_duration=50ep", "launcher.devices=2", f"hydra.run.dir={tmp_path}")
    wait_for(lambda: (tmp_path / "metrics.jsonl").is_file(), process)  # both ranks are training
    ranks = _ranks_of(process)
    assert len(ranks) == 2
    os.kill(ranks[signalled], signal.SIGUSR1)
    _, stderr = process.communicate(timeout=120)  # a rank left behind would hang its peer's next collective
    assert process.returncode == 75 == RunPreempted.exit_code, stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "preempted"
    checkpoint = list_checkpoints(tmp_path / "checkpoints")[-1]
    assert checkpoint.name.endswith(f"-ba{summary['batches']}.pt"), (checkpoint.name, summary["batches"])


def _file_size_limit(limit):
    def apply():  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path):
    first = run_here(*TINY, "max_duration=1ep", f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr
    previous = tmp_path / "checkpoints" / "ep1-ba22.pt"
    saved = previous.read_bytes()
    assert len(saved) > 64_000  # the limit below stops checkpoints, not the small logs
    command = [sys.executable, "-m", "trainrun", *TINY, "resume=auto", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, preexec_fn=_file_size_limit(64_000))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"trainrun: error: could not write checkpoint '{tmp_path / 'checkpoints' / 'ep2-ba44.pt'}': File too large; "
        "the checkpoints written before it are intact (resume=auto continues from the newest)"
    ]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ep1-ba22.pt"]  # no partial file
    assert previous.read_bytes() == saved and load_checkpoint(previous)["progress"]["batch"] == 22
    again = run_here(*TINY, "resume=auto", f"hydra.run.dir={tmp_path}")  # space again: it continues
    assert again.returncode == 0, again.stderr
    assert read_metrics(tmp_path)[-1]["batch"] == 44
