"""trainrun under a real Slurm: a one-machine cluster (``tests/slurm_cluster.py``: slurmctld and
slurmd on this host). A multirun through ``hydra/launcher=trainrun_slurm``,
an ``sbatch`` script as README shows it, and a job signalled before its end that writes a
checkpoint, requeues itself and resumes to the weights of an uninterrupted job."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import read_metrics
from slurm_cluster import (
    OVERRIDES,
    Cluster,
    assert_requeued_and_resumed,
    free_port,
    listening_ranks,
    multirun,
    running_cluster,
    sbatch_script,
    signal_while_held,
    slurm_conf,
    wait,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # jobs of two ranks on a real cluster


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[Cluster]:
    """A one-node cluster: this host, its cores; Slurm's commands run here."""
    folder = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname().split(".")[0]
    conf = slurm_conf(folder, host, [host], (free_port(), free_port()), os.cpu_count())
    with running_cluster(folder, conf, [["slurmctld", "-i"], ["slurmd"]], [host], []) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory) -> Path:
    """A job of the README's sbatch script run to its end: its run folder."""
    folder = tmp_path_factory.mktemp("straight")
    job = slurm.submit(sbatch_script(folder / "run", folder / "job.out", overrides=OVERRIDES), folder)
    state = slurm.finished(job)
    assert state["JobState"] == "COMPLETED", (folder / "job.out").read_text()
    return folder


def test_an_sbatch_script_trains_as_two_ranks(straight):
    output = (straight / "job.out").read_text()
    assert "2 rank(s)" in output and len(read_metrics(straight / "run")) == 1
    assert all((straight / "run" / name).is_file() for name in ("config.yaml", "summary.json", "metrics.jsonl"))


def test_a_job_signalled_before_its_end_checkpoints_requeues_and_resumes_to_the_uninterrupted_weights(
    slurm, straight, tmp_path
):
    """``scancel --signal=USR1``, sent once both ranks listen (held meanwhile, so that it comes before
    the run's end): every rank stops at the same step, the checkpoint is written, rank 0 requeues the
    job, which starts again (once its revoked credential expires: 10 s here, ``AuthInfo=cred_expire``)
    and resumes with resume=auto to the weights of the same job run straight through."""
    script = sbatch_script(
        tmp_path / "run", tmp_path / "job.out", "--requeue", "--open-mode=append", overrides=OVERRIDES
    )
    job = slurm.submit(script, tmp_path)
    ranks: list[int] = []
    wait(lambda: ranks.extend(listening_ranks(tmp_path / "run", 2)) or ranks, 120, "both ranks to listen", every=0.02)
    signal_while_held(ranks, slurm, job)
    assert_requeued_and_resumed(slurm, job, tmp_path, straight)


def test_a_multirun_through_the_slurm_launcher_runs_each_job_as_two_ranks(slurm, tmp_path):
    multirun(slurm, tmp_path, "hydra.launcher.tasks_per_node=2")
    logs = "".join(path.read_text() for path in (tmp_path / ".submitit").rglob("*_log.out"))
    assert logs.count("2 rank(s)") == 2  # each job's rank 0 banner: two ranks a job
