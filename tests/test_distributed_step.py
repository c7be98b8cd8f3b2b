"""What several ranks do inside one step, in two real gloo processes: DDP's settings, batch-norm
statistics averaged where they are read, ``auto`` micro-batches handing back to DDP once settled,
and ranks deciding divergence together."""

import copy
import importlib
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from test_algorithms_training import fixed_batch_state
from test_microbatches import group_norm_model, weights

from trainrun.core import distributed
from trainrun.core.engine import Engine
from trainrun.core.microbatches import Microbatching
from trainrun.core.trainer import MAX_SKIPPED_STEPS, Trainer, TrainerSettings
from trainrun.errors import TrainingDiverged

WORLD = 2
STEPS = 5


def batch():
    torch.manual_seed(1)
    return torch.randint(0, 256, (64, 3, 4, 4), dtype=torch.uint8), torch.randint(0, 5, (64,))


def trainer(model, images, labels, rank=0, world_size=1, microbatching=None):
    state = fixed_batch_state(model, images, labels, STEPS, num_classes=5)
    state.rank, state.world_size = rank, world_size

    def optimization(final_model):
        optimizer = torch.optim.SGD(final_model.parameters(), lr=0.5, momentum=0.9)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    settings = TrainerSettings("1000ba", 1, microbatching=microbatching or Microbatching())
    return Trainer(state, optimization, Engine([], []), settings)


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU group: CUDA's own threads would count as the group's
    torch.set_num_threads(1)
    threads_before = thread_names()
    distributed.join("cpu", timeout_minutes=2)
    results = {}
    norm = torch.nn.BatchNorm1d(3)
    norm.running_mean.fill_(rank + 1.0), norm.running_var.fill_(2.0 * (rank + 1)), norm.num_batches_tracked.fill_(7)
    distributed.average_buffers(norm, WORLD)
    results["buffers"] = [norm.running_mean.tolist(), norm.running_var.tolist(), int(norm.num_batches_tracked)]
    pairs = ((None, 5), (None, None), (7, 3), (4, 4))  # (rank 0's, rank 1's)
    results["first"] = distributed.firsts_on_any_rank([pair[rank] for pair in pairs], WORLD)
    distributed.wait_for_all(WORLD)

    # auto micro-batches: two steps averaged by hand after agreeing, then DDP synchronises
    import trainrun.core.microbatches as microbatches_module

    agreements = []
    real_any_rank = microbatches_module.any_rank
    microbatches_module.any_rank = lambda flag, ranks: agreements.append(ranks) or real_any_rank(flag, ranks)
    images, labels = batch()
    half = slice(rank * 32, rank * 32 + 32)
    run = trainer(group_norm_model(), images[half], labels[half], rank, WORLD, Microbatching(auto=True, settle_steps=2))
    ddp = run.state.model
    synced = getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None))  # torch 2.15 renamed it
    results["ddp"] = {"bucket_view": ddp.gradient_as_bucket_view, "forward_sync": synced}
    run.fit()
    results["agreements"] = agreements
    results["weights"] = weights(run.state)

    # a non-finite loss on rank 1 only: both ranks stop at its step with the same message
    diverging = trainer(group_norm_model(), images[half], labels[half], rank, WORLD)
    diverging._pending_losses = [torch.tensor(1.0), torch.tensor(float("nan") if rank == 1 else 2.0)]
    diverging.state.batch = 12
    with pytest.raises(TrainingDiverged) as caught:
        diverging._flush_losses()
    results["diverged"] = str(caught.value)

    # leaving ends the group's worker threads, even after torch._dynamo's import took the group of
    # the moment as a default argument
    importlib.import_module("torch._dynamo")

    del ddp, caught
    for each in (run, diverging):
        each.state.model = distributed.unwrapped(each.state.model)
    distributed.leave()
    results["threads"] = [threads_before, thread_names()]
    torch.save(results, f"{out}/{rank}.pt")


def thread_names() -> list[str]:
    """This process's threads, by the names the kernel shows (sorted)."""
    return sorted(Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(worker, args=(free_port(), str(out)), nprocs=WORLD, start_method="spawn")
    return [torch.load(out / f"{rank}.pt", weights_only=False) for rank in range(WORLD)]


@pytest.mark.distributed
def test_ddp_keeps_gradients_in_its_buckets_and_each_ranks_own_statistics(two_ranks):
    for rank in two_ranks:
        assert rank["ddp"] == {"bucket_view": True, "forward_sync": False}
        assert rank["buffers"] == [[1.5] * 3, [3.0] * 3, 7]  # floating buffers averaged, counts untouched


@pytest.mark.distributed
def test_leaving_ends_the_groups_threads_before_interpreter_exit(two_ranks):
    for rank in two_ranks:
        before, after = rank["threads"]
        assert after == before, f"the process group outlived distributed.leave(): {before} then {after}"


@pytest.mark.distributed
def test_auto_micro_batches_hand_back_to_ddp_once_settled_and_train_the_one_rank_step(two_ranks):
    images, labels = batch()
    whole = trainer(group_norm_model(), images, labels)
    whole.fit()
    for rank in two_ranks:
        assert rank["agreements"] == [WORLD, WORLD] + [1] * (STEPS - 2)  # settled after 2 steps: no agreement round
        for got, expected in zip(rank["weights"], weights(whole.state), strict=True):
            assert got.shape == expected.shape
            assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.distributed
def test_ranks_decide_together_and_stop_at_the_first_diverged_step_of_any(two_ranks):
    assert [rank["first"] for rank in two_ranks] == [[5, None, 3, 4]] * 2
    assert [rank["diverged"] for rank in two_ranks] == [
        "loss is not finite at step 12 (epoch 0); try a lower optimizer.lr, gradient clipping or precision=fp32"
    ] * 2


def test_under_fp16_loss_scaling_skipped_steps_are_tolerated_until_too_many_in_a_row():
    images, labels = batch()
    run = trainer(group_norm_model(), images, labels)
    run.state.precision = copy.copy(run.state.precision)
    run.state.precision.scaler = torch.amp.GradScaler("cpu")
    run.state.batch = 3
    run._pending_losses = [torch.tensor(2.0), torch.tensor(float("inf")), torch.tensor(1.0)]
    run._flush_losses()
    assert run.state.train_loss == 1.0 and run.window.loss_sum == 3.0 and run.window.loss_count == 2
    assert [n["text"] for n in run.state.notices] == ["fp16 loss scaling skipped 1 step(s) before step 4"]
    run.state.batch = 3 + MAX_SKIPPED_STEPS
    run._pending_losses = [torch.tensor(float("nan"))] * MAX_SKIPPED_STEPS
    with pytest.raises(TrainingDiverged, match=f"at step {3 + MAX_SKIPPED_STEPS} "):
        run._flush_losses()
    run.state.precision.scaler = None  # without loss scaling the first one ends the run
    run._pending_losses, run._skipped_in_a_row = [torch.tensor(1.0), torch.tensor(float("inf"))], 0
    with pytest.raises(TrainingDiverged, match=f"at step {3 + MAX_SKIPPED_STEPS} "):
        run._flush_losses()


def test_settling_counts_fitted_steps_and_restarts_for_larger_inputs_or_after_running_out():
    micro = Microbatching(auto=True, settle_steps=2)
    assert not micro.settled(100)
    micro.step_fitted()
    assert not micro.settled(100)
    micro.step_fitted()
    assert micro.settled(100) and micro.settled(50)
    assert not micro.settled(101)  # larger inputs (progressive resizing): not known to fit
    micro.step_fitted(), micro.step_fitted()
    assert micro.settled(101)
    micro.shrink(64)
    assert not micro.settled(101) and micro.size == 32
