"""Gradient accumulation: micro-batches give the whole batch's step; ``auto`` halves on out-of-memory."""

import copy

import pytest
import torch
from conftest import EXACT, read_metrics, run_here
from test_algorithms_training import fixed_batch_state

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.specs.label_smoothing import LabelSmoothingConfig
from trainrun.algorithms.specs.mixup import MixUpConfig
from trainrun.core.engine import Engine
from trainrun.core.microbatches import Microbatching, microbatch_slices, take
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.tasks.base import Evaluator
from trainrun.tasks.image_classification import ImageClassification


def group_norm_model() -> torch.nn.Module:
    """No batch statistics: a sample's gradient does not depend on the others in its batch."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.GroupNorm(2, 4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    )


class RunsOutOfMemory(torch.nn.Module):
    """Raises the device's out-of-memory error for training batches above ``limit`` samples."""

    def __init__(self, model: torch.nn.Module, limit: int) -> None:
        super().__init__()
        self.model, self.limit, self.sizes = model, limit, []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.model(inputs)
        self.sizes.append(len(inputs))
        if len(inputs) > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory at {len(inputs)} samples")
        return self.model(inputs)


def train(model, microbatching, steps=3, algorithms=()):
    """``steps`` SGD-with-momentum steps on one fixed batch of 64; returns the final state."""
    torch.manual_seed(1)
    images = torch.randint(0, 256, (64, 3, 4, 4), dtype=torch.uint8)
    labels = torch.randint(0, 5, (64,))
    state = fixed_batch_state(model, images, labels, steps, num_classes=5)

    def optimization(final_model):
        optimizer = torch.optim.SGD(final_model.parameters(), lr=0.5, momentum=0.9)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    settings = TrainerSettings("1000ba", 1, microbatching=microbatching)
    Trainer(state, optimization, Engine(list(algorithms), []), settings).fit()
    return state


def weights(state):
    return [p.detach() for p in state.raw_model.parameters()]


def test_slices_cover_the_batch_and_take_slices_only_batch_values():
    assert microbatch_slices(10, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert microbatch_slices(10, None) == [slice(0, 10)]
    targets = (torch.arange(6), torch.arange(6) * 2, torch.tensor(0.3), torch.zeros(3))
    first, second, weight, other = take(targets, slice(2, 4), 6)
    assert first.tolist() == [2, 3] and second.tolist() == [4, 6]
    assert weight is targets[2] and other is targets[3]  # not of the batch: shared by every micro-batch


@pytest.mark.parametrize("size", [32, 16, 24])
@pytest.mark.parametrize("with_methods", [False, True], ids=["plain", "mixup+label_smoothing"])
def test_micro_batches_equal_the_whole_batch(size, with_methods):
    """2 micro-batches of 32 (also 4 of 16, and 24+24+16) give the weights of 1 batch of 64."""
    methods = {"mixup": MixUpConfig(alpha=0.4), "label_smoothing": LabelSmoothingConfig(0.1)}
    whole = train(group_norm_model(), Microbatching(), algorithms=build_algorithms(methods) if with_methods else ())
    parts = train(group_norm_model(), Microbatching(size), algorithms=build_algorithms(methods) if with_methods else ())
    for a, b in zip(weights(whole), weights(parts), strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
    assert parts.loss.shape == () and torch.allclose(parts.loss, whole.loss, atol=1e-6)  # the batch's mean loss
    assert parts.inputs.shape[0] == 64  # the step's batch is whole again after it


def test_micro_batches_change_a_model_with_batch_statistics():
    """Batch norm sees each micro-batch's statistics: not the whole batch's step (why the tests above avoid it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(16, 5)
    )
    whole = train(copy.deepcopy(model), Microbatching())
    parts = train(copy.deepcopy(model), Microbatching(16))
    assert not torch.allclose(weights(whole)[0], weights(parts)[0], atol=1e-4)


def test_auto_halves_on_out_of_memory_and_keeps_the_step_exact():
    """Starting at the whole batch of 64 with room for 20: 64 fails, 32 fails, 16 fits; the step is
    retried from scratch, so the weights are those of the whole-batch step."""
    whole = train(group_norm_model(), Microbatching())
    model = RunsOutOfMemory(group_norm_model(), limit=20)
    auto = train(model, Microbatching(64, auto=True))
    assert model.sizes[:6] == [64, 32, 16, 16, 16, 16] and set(model.sizes[6:]) == {16}
    for a, b in zip(weights(whole), weights(auto), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert [n["text"] for n in auto.notices] == [
        "device_train_microbatch_size=auto: out of memory at 64 samples per micro-batch, retrying the step with 32",
        "device_train_microbatch_size=auto: out of memory at 32 samples per micro-batch, retrying the step with 16",
    ]


class UnscoredLabels(ImageClassification):
    """Samples labelled -100 are not scored: each batch's mean loss is over another number of
    terms, as a language model's over its predicted tokens."""

    def loss_terms(self, targets: torch.Tensor) -> torch.Tensor:
        return (targets != -100).sum()

    def evaluator(self, state):
        return NoEvaluation()  # -100 is no class to score


class NoEvaluation(Evaluator):
    def update(self, outputs, targets):
        pass

    def compute(self):
        return {"top1": 0.0}


def test_micro_batches_weigh_their_mean_loss_by_their_share_of_the_steps_scored_terms():
    """Micro-batches of 16 scoring 2, 16, 16 and 9 samples: weighed by samples, the first's 2 terms
    would count as much as 16; weighed by terms, the step is the whole batch's mean over 43."""
    torch.manual_seed(1)
    images = torch.randint(0, 256, (64, 3, 4, 4), dtype=torch.uint8)
    labels = torch.randint(0, 5, (64,))
    labels[2:16], labels[55:] = -100, -100

    def trained(microbatching):
        state = fixed_batch_state(group_norm_model(), images, labels, 3, num_classes=5)
        state.task, state.loss_fn = UnscoredLabels(), torch.nn.CrossEntropyLoss(ignore_index=-100)

        def optimization(final_model):
            optimizer = torch.optim.SGD(final_model.parameters(), lr=0.5, momentum=0.9)
            return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

        Trainer(state, optimization, Engine([], []), TrainerSettings("1000ba", 1, microbatching=microbatching)).fit()
        return state

    whole, parts = trained(Microbatching()), trained(Microbatching(16))
    for a, b in zip(weights(whole), weights(parts), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(parts.loss) == pytest.approx(float(whole.loss), rel=1e-6)  # the reported loss too


def test_without_auto_out_of_memory_is_raised():
    with pytest.raises(torch.OutOfMemoryError):
        train(RunsOutOfMemory(group_norm_model(), limit=20), Microbatching(32))
    with pytest.raises(torch.OutOfMemoryError, match="micro-batches of one sample"):
        train(RunsOutOfMemory(group_norm_model(), limit=0), Microbatching(64, auto=True))


EXACT = [*EXACT, "checkpoint.interval=null"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("setting", ["16", "auto"])
def test_two_ranks_with_micro_batches_train_what_one_rank_trains(tmp_path, setting):
    """DDP synchronises only the last micro-batch (16), or the ranks average by hand after agreeing
    no rank ran out of memory (auto): either way the step is the one-rank, whole-batch step."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert run_here(*EXACT, f"hydra.run.dir={one}").returncode == 0  # one rank: in this process
    result = run_here(*EXACT, "launcher.devices=2", f"device_train_microbatch_size={setting}", f"hydra.run.dir={two}")
    assert result.returncode == 0, result.stderr
    (first,), (second,) = read_metrics(one), read_metrics(two)
    assert second["train_loss"] == pytest.approx(first["train_loss"], abs=1e-5)
    assert second["eval_loss"] == pytest.approx(first["eval_loss"], abs=1e-4)


class EvaluationPasses(torch.nn.Module):
    """``model``, recording each evaluation pass's size."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.passes = model, []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.training:
            self.passes.append(len(inputs))
        return self.model(inputs)


def evaluated(size: int | None, own: int | None = None) -> tuple[dict, list[int]]:
    """One evaluation of a fixed batch of 64 in micro-batches of ``size``, this rank's own samples
    being its first ``own`` (the rest repeats, as on a rank with fewer samples than the others)."""
    torch.manual_seed(1)
    images = torch.randint(0, 256, (64, 3, 4, 4), dtype=torch.uint8)
    labels = torch.randint(0, 5, (64,))
    if own is not None:
        images, labels = images.clone(), labels.clone()
        images[own:], labels[own:] = images[0], labels[0]  # the repeats: what ShardSampler pads with
    model = EvaluationPasses(group_norm_model())
    state = fixed_batch_state(model, images, labels, 1, num_classes=5)
    state.data.eval_samples = own

    def optimization(final_model):
        optimizer = torch.optim.SGD(final_model.parameters(), lr=0.0)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    trainer = Trainer(
        state, optimization, Engine([], []), TrainerSettings("1000ba", 1, microbatching=Microbatching(size))
    )
    state.accounts.start()
    metrics = trainer.evaluate()
    return {key: metrics[key] for key in ("top1", "eval_loss")}, model.passes


def test_evaluation_runs_in_the_training_micro_batches_and_scores_only_the_ranks_own_samples():
    whole, passes = evaluated(None)
    assert passes == [64]
    split, passes = evaluated(16)
    assert passes == [16, 16, 16, 16] and split == pytest.approx(whole)  # peak within a training pass's
    own, passes = evaluated(16, own=40)  # 24 repeats: the passes stay those of every other rank
    assert passes == [16, 16, 16, 16]
    torch.manual_seed(1)
    images, labels = torch.randint(0, 256, (64, 3, 4, 4), dtype=torch.uint8), torch.randint(0, 5, (64,))
    model = group_norm_model().eval()
    with torch.no_grad():
        logits = model(ImageClassification().normalise(images[:40]))
    expected_loss = torch.nn.functional.cross_entropy(logits, labels[:40]).item()
    assert own["eval_loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert own["top1"] == pytest.approx((logits.argmax(1) == labels[:40]).float().mean().item())
