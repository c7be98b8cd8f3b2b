"""trainrun under a real Slurm: a one-machine cluster of Debian's ``slurm-wlm`` and ``munge``
(slurmctld and slurmd on this host, their own munge daemon, key, ports and folders, started here
from a generated ``slurm.conf`` and stopped after). A multirun through ``hydra/launcher=trainrun_slurm``,
an ``sbatch`` script as README shows it, and a job signalled before its end that writes a
checkpoint, requeues itself and resumes to the weights of an uninterrupted job."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import EXACT, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # jobs of two ranks on a real cluster

PYTHON = f"{sys.executable} -m trainrun"
DIGITS = [arg for arg in EXACT if not arg.startswith("max_duration")]  # one rank and two agree on these


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slurm_conf(folder: Path, host: str) -> str:
    """A one-node cluster: this host, its cores, everything in ``folder``, no accounting, no cgroups."""
    user, ports = getpass.getuser(), (free_port(), free_port())
    settings = {
        "ClusterName": "trainrun", "SlurmctldHost": host, "SlurmUser": user, "SlurmdUser": user,
        "AuthType": "auth/munge", "CredType": "cred/munge",
        "AuthInfo": f"socket={folder / 'munge.socket'},cred_expire=10",  # a requeued job starts again after it
        "StateSaveLocation": folder / "state", "SlurmdSpoolDir": folder / "spool",
        "SlurmctldPidFile": folder / "slurmctld.pid", "SlurmdPidFile": folder / "slurmd.pid",
        "SlurmctldLogFile": folder / "slurmctld.log", "SlurmdLogFile": folder / "slurmd.log",
        "SlurmctldPort": ports[0], "SlurmdPort": ports[1], "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none", "MpiDefault": "none", "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core", "ReturnToService": 2, "JobRequeue": 1,
        "AccountingStorageType": "accounting_storage/none", "JobAcctGatherType": "jobacct_gather/none",
        "NodeName": f"{host} CPUs={os.cpu_count()} State=UNKNOWN",
        "PartitionName": "debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
    }  # fmt: skip
    return "".join(f"{key}={value}\n" for key, value in settings.items())


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The cluster's environment (``SLURM_CONF``) while it runs."""
    for program in ("munged", "slurmctld", "slurmd", "sbatch"):
        assert shutil.which(program), f"{program} is not installed (scripts/setup_env.sh installs slurm-wlm and munge)"
    folder = tmp_path_factory.mktemp("slurm")
    for name in ("state", "spool"):
        (folder / name).mkdir()
    (folder / "munge.key").write_bytes(os.urandom(1024))
    (folder / "munge.key").chmod(0o600)
    munge = [f"--key-file={folder / 'munge.key'}", f"--socket={folder / 'munge.socket'}"]
    munge += [f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}"]
    munge += [f"--seed-file={folder / 'munged.seed'}"]
    subprocess.run(["munged", "--force", *munge], check=True)
    (folder / "slurm.conf").write_text(slurm_conf(folder, socket.gethostname().split(".")[0]))
    environment = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    subprocess.run(["slurmctld", "-i"], env=environment, check=True)
    subprocess.run(["slurmd"], env=environment, check=True)
    try:
        wait(lambda: "idle" in command(["sinfo", "-h", "-o", "%T"], environment), 60, "the node to be idle")
        yield environment
    finally:  # the jobs' steps end first (a multirun returns as its tasks finish), then the daemons
        with contextlib.suppress(AssertionError):
            wait(lambda: not command(["squeue", "-h"], environment).strip(), 60, "every job to end")
        subprocess.run(["scontrol", "shutdown"], env=environment, capture_output=True)
        subprocess.run(["munged", "--stop", f"--socket={folder / 'munge.socket'}"], capture_output=True)


def command(arguments: list[str], environment: dict[str, str]) -> str:
    return subprocess.run(arguments, env=environment, capture_output=True, text=True).stdout


def wait(condition, seconds: float, what: str, every: float = 0.5) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(every)


def has_usr1(pid: int, field: str) -> bool:
    """Whether SIGUSR1 is in ``/proc/PID/status``'s signal mask ``field`` (SigCgt: caught; ShdPnd: pending)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return bool(int(re.search(rf"^{field}:\s*([0-9a-f]+)", status, re.MULTILINE)[1], 16) >> (signal.SIGUSR1 - 1) & 1)


def listening_ranks(run_dir: Path) -> list[int]:
    """The pids of the job's two ranks (this Python running trainrun into ``run_dir``) once both
    catch SIGUSR1; empty before."""
    ranks = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            arguments = (entry / "cmdline").read_bytes().decode().split("\0") if entry.name.isdigit() else []
            if arguments[:1] == [sys.executable] and f"hydra.run.dir={run_dir}" in arguments:
                ranks.append(int(entry.name))
    return ranks if len(ranks) == 2 and all(has_usr1(pid, "SigCgt") for pid in ranks) else []


def job_state(job: str, environment: dict[str, str]) -> dict[str, str]:
    """``scontrol show job``'s fields of ``job``."""
    shown = command(["scontrol", "show", "job", job], environment).split()
    return dict(field.split("=", 1) for field in shown if "=" in field)


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def eligible_again(job: str, environment: dict[str, str], output: Path) -> bool:
    """Whether ``job`` has been requeued and may start again: pending past its EligibleTime (local
    time), or started again already (a pass of the scheduler can come first); one that ended without
    a requeue fails at once, with the end of its output."""
    state = job_state(job, environment)
    if state.get("Restarts") != "1":
        ended = state.get("JobState") in ENDED
        assert not ended, f"job {job} ended without a requeue: {state}\n{output.read_text()[-1500:]}"
        return False
    return state.get("JobState") != "PENDING" or time.strftime("%Y-%m-%dT%H:%M:%S") > state.get("EligibleTime", "9")


def submit(script: str, folder: Path, environment: dict[str, str]) -> str:
    (folder / "job.sh").write_text(script)
    result = subprocess.run(
        ["sbatch", "--parsable", str(folder / "job.sh")], env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def finished(job: str, environment: dict[str, str], seconds: float = 240) -> dict[str, str]:
    wait(
        lambda: job_state(job, environment).get("JobState") in ENDED,
        seconds,
        f"job {job}",
    )
    return job_state(job, environment)


def sbatch_script(run_dir: Path, output: Path, *options: str, overrides: str = "") -> str:
    """The README's sbatch script: one task a rank, trainrun in each through srun, resume=auto."""
    lines = ["#!/bin/bash", "#SBATCH --ntasks=2", f"#SBATCH --output={output}", *(f"#SBATCH {o}" for o in options)]
    lines.append(f"srun {PYTHON} {' '.join(DIGITS)} {overrides} hydra.run.dir={run_dir} resume=auto")
    return "\n".join(lines) + "\n"


OVERRIDES = "max_duration=30ba eval_interval=30ba log_interval=2"  # a loss check, a chance to stop, every 2 steps
LAST = "ep1-ba30.pt"  # the run's final checkpoint


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory) -> Path:
    """A job of the README's sbatch script run to its end: its run folder."""
    folder = tmp_path_factory.mktemp("straight")
    job = submit(sbatch_script(folder / "run", folder / "job.out", overrides=OVERRIDES), folder, slurm)
    state = finished(job, slurm)
    assert state["JobState"] == "COMPLETED", (folder / "job.out").read_text()
    return folder


def test_an_sbatch_script_trains_as_two_ranks(straight):
    output = (straight / "job.out").read_text()
    assert "2 rank(s)" in output and len(read_metrics(straight / "run")) == 1
    assert all((straight / "run" / name).is_file() for name in ("config.yaml", "summary.json", "metrics.jsonl"))


def test_a_job_signalled_before_its_end_checkpoints_requeues_and_resumes_to_the_uninterrupted_weights(
    slurm, straight, tmp_path
):
    """``scancel --signal=USR1`` (what ``#SBATCH --signal=USR1@SECONDS`` sends before the time limit),
    sent once both ranks listen (they are held meanwhile, so it comes before the run's end):
    every rank stops at the same step, the checkpoint is written, rank 0 requeues the job, which
    starts again (once its revoked credential expires: 10 s here, ``AuthInfo=cred_expire``; the scheduler then
    nudged rather than left to its next pass) and
    resumes with resume=auto to the weights of the same job run straight through."""
    script = sbatch_script(
        tmp_path / "run", tmp_path / "job.out", "--requeue", "--open-mode=append", overrides=OVERRIDES
    )
    job = submit(script, tmp_path, slurm)
    ranks: list[int] = []
    wait(lambda: ranks.extend(listening_ranks(tmp_path / "run")) or ranks, 120, "both ranks to listen", every=0.02)
    for pid in ranks:  # held while the notice travels, so that it lands before the run's end however slow Slurm is
        os.kill(pid, signal.SIGSTOP)
    try:
        subprocess.run(["scancel", "--signal=USR1", job], env=slurm, check=True)
        wait(lambda: all(has_usr1(pid, "ShdPnd") for pid in ranks), 60, "the notice to reach both ranks")
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    wait(lambda: eligible_again(job, slurm, tmp_path / "job.out"), 120, "the requeued job's credential to expire")
    if job_state(job, slurm).get("JobState") == "PENDING":
        # a pass of the scheduler now rather than at its next period (sched_interval, 60 s): the job starts
        # (not checked: the scheduler may have started it since; the job's end is checked below)
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm, capture_output=True)
    state = finished(job, slurm)
    output = (tmp_path / "job.out").read_text()
    said = {key: state.get(key) for key in ("JobState", "Restarts", "Reason", "ExitCode", "RunTime")}
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", (said, output[-400:])
    assert "trainrun: requeued Slurm job" in output and "resumed from" in output
    stopped = int(re.search(r"checkpoint at step (\d+)", output)[1])  # where every rank stopped
    checkpoints = {path.name for path in (tmp_path / "run" / "checkpoints").glob("*.pt")}
    assert stopped < 30 and {f"ep{stopped // 22}-ba{stopped}.pt", LAST} == checkpoints  # 22 steps an epoch
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    weights = [
        torch.load(run / "run" / "checkpoints" / LAST, weights_only=True)["model"] for run in (tmp_path, straight)
    ]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[1])


def test_a_multirun_through_the_slurm_launcher_runs_each_job_as_two_ranks(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    launcher = ["hydra/launcher=trainrun_slurm", "hydra.launcher.tasks_per_node=2", "hydra.launcher.gpus_per_node=0"]
    launcher += ["hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=null", "hydra.launcher.timeout_min=10"]
    arguments = [sys.executable, "-m", "trainrun", "-m", *launcher, *DIGITS, "max_duration=4ba", "eval_interval=4ba"]
    arguments.append("seed=1,2")
    result = subprocess.run([*arguments, f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert all((tmp_path / job / name).is_file() for name in ("config.yaml", "summary.json", "metrics.jsonl"))
        assert read_metrics(tmp_path / job)
    logs = "".join(path.read_text() for path in (tmp_path / ".submitit").rglob("*_log.out"))
    assert logs.count("2 rank(s)") == 2  # each job's rank 0 banner: two ranks a job
