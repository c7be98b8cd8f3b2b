"""A real Slurm cluster for the tests: Debian's ``slurm-wlm`` and ``munge``, their own munge daemon,
key, ports and folders, started from a generated ``slurm.conf`` and stopped after. One node on this
host (``tests/test_slurm.py``), or a node a network namespace with the controller in a third
(``tests/test_slurm_nodes.py``): :class:`Cluster` runs Slurm's commands where the controller is
reached."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from conftest import EXACT, assert_equal_to_summation_order, read_metrics

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
PYTHON = f"{sys.executable} -m trainrun"
DIGITS = [arg for arg in EXACT if not arg.startswith("max_duration")]  # one rank and four agree on these


def slurm_conf(folder: Path, controller: str, nodes: list[str], ports: tuple[int, int], cpus: int) -> str:
    """A cluster of ``nodes`` (``NodeName`` lines' settings), everything in ``folder``, no
    accounting, no cgroups; a node's spool, pid and log files its own (``%n``)."""
    user = getpass.getuser()
    settings = {
        "ClusterName": "trainrun", "SlurmctldHost": controller, "SlurmUser": user, "SlurmdUser": user,
        "AuthType": "auth/munge", "CredType": "cred/munge",
        "AuthInfo": f"socket={folder / 'munge.socket'},cred_expire=10",  # a requeued job starts again after it
        "StateSaveLocation": folder / "state", "SlurmdSpoolDir": folder / "spool-%n",
        "SlurmctldPidFile": folder / "slurmctld.pid", "SlurmdPidFile": folder / "slurmd-%n.pid",
        "SlurmctldLogFile": folder / "slurmctld.log", "SlurmdLogFile": folder / "slurmd-%n.log",
        "SlurmctldPort": ports[0], "SlurmdPort": ports[1], "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none", "MpiDefault": "none", "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core", "ReturnToService": 1, "JobRequeue": 1, "KillWait": 5,
        "AccountingStorageType": "accounting_storage/none", "JobAcctGatherType": "jobacct_gather/none",
        "FirstJobId": first_job_id(),
    }  # fmt: skip
    lines = [f"{key}={value}" for key, value in settings.items()]
    lines += [f"NodeName={node} CPUs={cpus} State=UNKNOWN" for node in nodes]
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
    return "\n".join(lines) + "\n"


@dataclass
class Cluster:
    """A running cluster: its environment (``SLURM_CONF``) and where its commands run (``prefix``)."""

    environment: dict[str, str]
    prefix: list[str] = field(default_factory=list)
    folders: dict[str, Path] = field(default_factory=dict)  # each submitted job's folder

    def run(self, *arguments: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.prefix, *arguments], env=self.environment, capture_output=True, text=True, check=check,
            timeout=timeout,
        )  # fmt: skip

    def output(self, *arguments: str) -> str:
        return self.run(*arguments).stdout

    def job_state(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields of ``job``."""
        shown = self.output("scontrol", "show", "job", job).split()
        return dict(entry.split("=", 1) for entry in shown if "=" in entry)

    def submit(self, script: str, folder: Path) -> str:
        (folder / "job.sh").write_text(script)
        result = self.run("sbatch", "--parsable", str(folder / "job.sh"))
        assert result.returncode == 0, result.stderr
        job = result.stdout.strip().split(";")[0]
        self.folders[job] = folder
        return job

    def finished(self, job: str, seconds: float = 240) -> dict[str, str]:
        """``job``'s fields once it has ended; past ``seconds``, a failure that says its fields, the
        queue and the end of its output (the ``.out`` files of its folder)."""

        def said() -> str:
            outputs = sorted(self.folders[job].glob("*.out")) if job in self.folders else []
            tails = "\n".join(f"{path.name}: {path.read_text()[-1500:]}" for path in outputs)
            return f"{self.job_state(job)}\nqueue: {self.output('squeue', '-h')}\n{tails}"

        wait(lambda: self.job_state(job).get("JobState") in ENDED, seconds, f"job {job}", said)
        return self.job_state(job)

    def restarted(self, job: str, output: Path) -> bool:
        """Whether ``job`` has been requeued and may start again: pending past its EligibleTime (local
        time), or started again already (a pass of the scheduler can come first); one that ended
        without a requeue fails at once, with the end of its output. A pending one is then started
        at once rather than at the scheduler's next pass (``sched_interval``, 60 s)."""
        state = self.job_state(job)
        if state.get("Restarts") != "1":
            ended = state.get("JobState") in ENDED
            assert not ended, f"job {job} ended without a requeue: {state}\n{output.read_text()[-1500:]}"
            return False
        eligible = time.strftime("%Y-%m-%dT%H:%M:%S") > state.get("EligibleTime", "9")
        if state.get("JobState") == "PENDING" and eligible:
            self.run("scontrol", "update", f"JobId={job}", "StartTime=now")  # may have started since: not checked
        return state.get("JobState") != "PENDING" or eligible

    def idle(self, count: int) -> bool:
        return self.output("sinfo", "-h", "-N", "-o", "%T").split().count("idle") == count


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def first_job_id(jobs: int = 10) -> int:
    """A cluster's first job id, drawn so that its jobs' rendezvous ports (trainrun's 20000 + the job
    id modulo 20000) are free here: two clusters of the suite's workers, each numbering its jobs from
    1, would otherwise give their first jobs one port."""
    while True:
        first = random.randrange(1, 20000 - jobs)
        if all(port_free(20000 + first + offset) for offset in range(jobs)):
            return first


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def running_cluster(
    folder: Path, conf: str, daemons: list[list[str]], nodes: list[str], prefix: list[str]
) -> Iterator[Cluster]:
    """munge and the daemons (``slurmctld``, a ``slurmd`` a node: each a command) from ``conf`` in
    ``folder`` while the block runs, once every node is idle; stopped after, every job ended first."""
    for program in ("munged", "slurmctld", "slurmd", "sbatch"):
        assert shutil.which(program), f"{program} is not installed (scripts/setup_env.sh installs slurm-wlm and munge)"
    for name in ("state", *(f"spool-{node}" for node in nodes)):
        (folder / name).mkdir()
    (folder / "munge.key").write_bytes(os.urandom(1024))
    (folder / "munge.key").chmod(0o600)
    munge = [f"--key-file={folder / 'munge.key'}", f"--socket={folder / 'munge.socket'}"]
    munge += [f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}"]
    subprocess.run(["munged", "--force", *munge, f"--seed-file={folder / 'munged.seed'}"], check=True)
    (folder / "slurm.conf").write_text(conf)
    cluster = Cluster({**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}, prefix)
    try:
        for daemon in daemons:
            subprocess.run(daemon, env=cluster.environment, check=True)
        wait(lambda: cluster.idle(len(nodes)), 60, f"{len(nodes)} idle node(s)")
        yield cluster
    finally:  # the jobs' steps end first (a multirun returns as its tasks finish), then the daemons
        with contextlib.suppress(AssertionError):
            wait(lambda: not cluster.output("squeue", "-h").strip(), 60, "every job to end")
        cluster.run("scontrol", "shutdown")
        for pid_file in folder.glob("slurm*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)  # one that did not hear the shutdown
        subprocess.run(["munged", "--stop", f"--socket={folder / 'munge.socket'}"], capture_output=True)


def wait(
    condition: Callable[[], object],
    seconds: float,
    what: str,
    said: Callable[[], str] | None = None,
    every: float = 0.5,
) -> None:
    """Until ``condition`` holds, every ``every`` seconds; past ``seconds``, a failure naming ``what``
    (and what ``said`` says of it)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}" + (f": {said()}" if said else "")
        time.sleep(every)


def has_usr1(pid: int, field_name: str) -> bool:
    """Whether SIGUSR1 is in ``/proc/PID/status``'s signal mask ``field_name`` (SigCgt: caught; ShdPnd: pending)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = re.search(rf"^{field_name}:\s*([0-9a-f]+)", status, re.MULTILINE)[1]
    return bool(int(mask, 16) >> (signal.SIGUSR1 - 1) & 1)


def training_ranks(run_dir: Path) -> list[int]:
    """The pids of the processes (this Python running trainrun into ``run_dir``) of a job."""
    ranks = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            arguments = (entry / "cmdline").read_bytes().decode().split("\0") if entry.name.isdigit() else []
            if arguments[:1] == [sys.executable] and f"hydra.run.dir={run_dir}" in arguments:
                ranks.append(int(entry.name))
    return ranks


def listening_ranks(run_dir: Path, count: int) -> list[int]:
    """The pids of a job's ``count`` ranks once every one catches SIGUSR1; empty before."""
    ranks = training_ranks(run_dir)
    return ranks if len(ranks) == count and all(has_usr1(pid, "SigCgt") for pid in ranks) else []


def signal_while_held(ranks: list[int], cluster: Cluster, job: str) -> None:
    """``scancel --signal=USR1 JOB`` (what ``#SBATCH --signal=USR1@SECONDS`` sends before the time
    limit) to ranks held meanwhile, so that it lands before the run's end however slow Slurm is."""
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        cluster.run("scancel", "--signal=USR1", job, check=True)
        wait(lambda: all(has_usr1(pid, "ShdPnd") for pid in ranks), 60, "the notice to reach every rank")
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)


def sbatch_script(
    run_dir: Path, output: Path, *options: str, overrides: str = "", tasks: str = "--ntasks=2", srun: str = "srun"
) -> str:
    """The README's sbatch script: one task a rank (``tasks``), trainrun in each through ``srun``, resume=auto."""
    lines = ["#!/bin/bash", f"#SBATCH {tasks}", f"#SBATCH --output={output}", *(f"#SBATCH {o}" for o in options)]
    lines.append(f"{srun} {PYTHON} {' '.join(DIGITS)} {overrides} hydra.run.dir={run_dir} resume=auto")
    return "\n".join(lines) + "\n"


OVERRIDES = "max_duration=30ba eval_interval=30ba log_interval=2"  # a loss check, a chance to stop, every 2 steps
LAST = "ep1-ba30.pt"  # the run's final checkpoint


def assert_requeued_and_resumed(slurm: Cluster, job: str, folder: Path, straight: Path, exact: bool = True) -> None:
    """``job``, stopped by its notice, requeued by rank 0, ends once started again; it resumed from the
    step every rank stopped at to the weights of the job run straight through (``straight``): to the
    bit (``exact``: two ranks, whose sum has one order), else to float summation order (four ranks'
    sum follows DDP's buckets, which a resumed job builds anew at its first step)."""
    wait(lambda: slurm.restarted(job, folder / "job.out"), 120, "the requeued job's credential to expire")
    state = slurm.finished(job)
    output = (folder / "job.out").read_text()
    said = {key: state.get(key) for key in ("JobState", "Restarts", "Reason", "ExitCode", "RunTime")}
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", (said, output[-400:])
    assert "trainrun: requeued Slurm job" in output and "resumed from" in output, output[-2000:]
    stopped = int(re.search(r"checkpoint at step (\d+)", output)[1])  # where every rank stopped
    checkpoints = {path.name for path in (folder / "run" / "checkpoints").glob("*.pt")}
    assert stopped < 30 and {f"ep{stopped // 22}-ba{stopped}.pt", LAST} == checkpoints  # 22 steps an epoch
    summary = json.loads((folder / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    got, expected = (
        torch.load(run / "run" / "checkpoints" / LAST, weights_only=True)["model"] for run in (folder, straight)
    )
    if exact:
        assert all(torch.equal(got[name], value) for name, value in expected.items())
    else:
        assert_equal_to_summation_order(got, expected)


def multirun(slurm: Cluster, sweep: Path, *launcher: str) -> None:
    """Two jobs (seeds 1 and 2) through ``hydra/launcher=trainrun_slurm``, its ``launcher`` settings
    given; each wrote its run folder."""
    settings = ["hydra/launcher=trainrun_slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1"]
    settings += ["hydra.launcher.mem_gb=null", "hydra.launcher.timeout_min=10", *launcher]
    arguments = [sys.executable, "-m", "trainrun", "-m", *settings, *DIGITS, "max_duration=4ba", "eval_interval=4ba"]
    result = slurm.run(*arguments, "seed=1,2", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert all((sweep / job / name).is_file() for name in ("config.yaml", "summary.json", "metrics.jsonl"))
        assert read_metrics(sweep / job)
