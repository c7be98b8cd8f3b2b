"""Resuming on another number of ranks: nothing in a checkpoint is per rank."""

import shutil

import pytest
import torch
from conftest import EXACT, run_cli, run_here

ELASTIC = [*EXACT, "checkpoint.interval=10ba", "checkpoint.keep=5", "eval_batch_size=64"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_two_rank_run_killed_mid_epoch_ends_alike_resumed_on_one_or_four_ranks(tmp_path):
    """Group norm (no batch statistics), keyed flips: a 2-rank run's step-10 checkpoint of a 22-step
    epoch, resumed on 1 and on 4 gloo ranks, ends with the uninterrupted run's weights (to float
    summation order: each rank count sums the batch's gradients in another order)."""
    whole = tmp_path / "whole"
    assert run_here(*ELASTIC, "launcher.devices=2", f"hydra.run.dir={whole}").returncode == 0
    final = sorted((whole / "checkpoints").glob("*.pt"), key=lambda p: p.stat().st_mtime)[-1]
    expected = torch.load(final, weights_only=True)["model"]
    for ranks in (1, 4):
        resumed = tmp_path / f"on{ranks}"
        (resumed / "checkpoints").mkdir(parents=True)
        shutil.copy(whole / "checkpoints" / "ep0-ba10.pt", resumed / "checkpoints")  # as if killed after step 10
        run = run_here if ranks == 1 else run_cli  # one rank: in this process
        result = run(*ELASTIC, f"launcher.devices={ranks}", f"hydra.run.dir={resumed}", "resume=auto")
        assert result.returncode == 0 and "ep0-ba10.pt" in result.stdout, result.stderr
        got = torch.load(resumed / "checkpoints" / final.name, weights_only=True)
        assert got["topology"] == {"world_size": ranks, "global_batch": 64}
        for key, value in expected.items():
            torch.testing.assert_close(got["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    refused = tmp_path / "refused"
    (refused / "checkpoints").mkdir(parents=True)
    shutil.copy(whole / "checkpoints" / "ep0-ba10.pt", refused / "checkpoints")
    checkpoint = refused / "checkpoints" / "ep0-ba10.pt"
    for change, line in (
        (["launcher.devices=3"], "bad value for 'train_batch_size': 64 does not divide among 3 processes"),
        (
            ["launcher.devices=3", "train_batch_size=63", "eval_batch_size=63"],
            f"checkpoint '{checkpoint}' was trained with a global batch of 64 (train_batch_size); this run has 63: "
            "resume with train_batch_size=64",
        ),
    ):
        result = run_here(*ELASTIC, *change, f"hydra.run.dir={refused}", "resume=auto")  # refused before any worker
        assert result.returncode == 2
        assert result.stderr.startswith(f"trainrun: error: {line}") and result.stderr.count("\n") == 1
        assert sorted(path.name for path in refused.iterdir()) == ["checkpoints"]  # no worker started, nothing written
