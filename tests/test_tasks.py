"""The tasks without a run: batches onto the device, evaluators against hand counts, over ranks, the export."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainrun.data.masked_text import IGNORED
from trainrun.schema import DataConfig
from trainrun.tasks.base import build_task, token_loss_metrics
from trainrun.tasks.image_classification import ClassificationEvaluator, ImageClassification
from trainrun.tasks.masked_lm import MaskedLanguageModeling, MaskedTokenEvaluator, scored_labels


class AnotherRank:
    """``dist.all_reduce`` as a second rank would make it: its sums added to this rank's."""

    def __init__(self, sums: list[float]) -> None:
        self.sums, self.calls = sums, 0

    def __call__(self, tensor: torch.Tensor) -> None:
        tensor += torch.tensor(self.sums, dtype=tensor.dtype)
        self.calls += 1


def test_build_task_finds_each_task_by_its_config_name():
    assert isinstance(build_task("image_classification"), ImageClassification)
    assert isinstance(build_task("masked_lm"), MaskedLanguageModeling)
    default = build_task("image_classification")  # the data config's default normalisation
    assert default.mean.flatten().tolist() == [127.5] * 3 and default.std.flatten().tolist() == [63.75] * 3
    imagenet = build_task("image_classification", DataConfig(mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0]))
    assert imagenet.mean.flatten().tolist() == [127.5, 63.75, 0.0] and imagenet.std.shape == (1, 3, 1, 1)


def test_classification_metrics_accumulate_over_batches_with_top5_and_a_mean_loss():
    torch.manual_seed(0)
    batches = [(torch.randn(100, 10), torch.randint(0, 10, (100,))) for _ in range(3)]
    evaluator = build_task("image_classification").evaluator(
        SimpleNamespace(num_classes=10, device=torch.device("cpu"), world_size=1)
    )
    for logits, labels in batches:
        evaluator.update(logits, labels)
    logits, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    ranked = logits.argsort(-1, descending=True)
    metrics = evaluator.compute()
    assert set(metrics) == {"top1", "top5", "eval_loss"}
    assert metrics["top1"] == pytest.approx(float((ranked[:, 0] == labels).float().mean()))
    assert metrics["top5"] == pytest.approx(float((ranked[:, :5] == labels[:, None]).any(1).float().mean()))
    assert metrics["eval_loss"] == pytest.approx(float(F.cross_entropy(logits, labels)), rel=1e-6)
    assert evaluator.sums.dtype == torch.float64  # sums over a whole evaluation set, in double precision
    three = ClassificationEvaluator(3, torch.device("cpu"), 1)  # fewer than 5 classes: top-3 is every class
    three.update(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    assert three.compute()["top5"] == 1.0


@pytest.mark.parametrize("classes", [3, 10, 1000])
def test_classification_accuracy_counts_what_torchmetrics_counts(classes):
    """The evaluator's own top-1 and top-k counts against torchmetrics' MulticlassAccuracy (micro)."""
    from torchmetrics.classification import MulticlassAccuracy

    generator = torch.Generator().manual_seed(classes)
    top_k = min(5, classes)
    reference = [MulticlassAccuracy(classes, top_k=k, average="micro") for k in (1, top_k)]
    evaluator = ClassificationEvaluator(classes, torch.device("cpu"), 1)
    for size in (64, 37):
        logits = torch.randn(size, classes, generator=generator) * 3
        labels = logits.argmax(1)  # about half right at top-1, more at top-k
        labels[: size // 2] = torch.randint(0, classes, (size // 2,), generator=generator)
        evaluator.update(logits, labels)
        for metric in reference:
            metric.update(logits, labels)
    metrics = evaluator.compute()
    assert metrics["top1"] == pytest.approx(float(reference[0].compute()), abs=1e-6)  # its float32
    assert metrics["top5"] == pytest.approx(float(reference[1].compute()), abs=1e-6)
    assert 0 < metrics["top1"] < 1 and metrics["top1"] <= metrics["top5"]


def test_classification_sums_are_summed_over_ranks_in_one_reduce(monkeypatch):
    other = AnotherRank([12.0, 4.0, 3.0, 4.0])  # rank 1: 4 samples, loss 12, 3 right at top-1, 4 at top-3
    monkeypatch.setattr(dist, "all_reduce", other)
    evaluator = ClassificationEvaluator(3, torch.device("cpu"), world_size=2)
    logits, labels = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]]), torch.tensor([0, 2])
    evaluator.update(logits, labels)
    own = float(F.cross_entropy(logits, labels, reduction="sum"))
    metrics = evaluator.compute()
    assert metrics == {"top1": pytest.approx(4 / 6), "top5": 1.0, "eval_loss": pytest.approx((own + 12.0) / 6)}
    assert other.calls == 1
    single = ClassificationEvaluator(3, torch.device("cpu"), world_size=1)
    single.update(logits, labels)
    assert single.compute()["top1"] == 0.5
    assert other.calls == 1  # one rank: nothing to reduce


def test_evaluators_keep_their_sums_on_the_runs_device():
    meta = SimpleNamespace(num_classes=10, device=torch.device("meta"), world_size=1)
    classification = build_task("image_classification").evaluator(meta)
    assert classification.sums.device.type == "meta"
    assert build_task("masked_lm").evaluator(meta).sums.device.type == "meta"


def test_image_batches_go_to_the_device_normalised_in_the_runs_memory_format():
    task = ImageClassification(DataConfig(mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0]))
    state = SimpleNamespace(device=torch.device("meta"), memory_format=torch.channels_last)
    images, labels = torch.zeros(3, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 1, 2])
    inputs, targets, count = task.batch((images, labels), state)
    assert count == 3 and inputs.device.type == targets.device.type == "meta"
    assert {t.device.type for t in task._device_constants} == {"meta"}  # a GPU refuses CPU constants
    assert inputs.dtype == torch.float32 and inputs.is_contiguous(memory_format=torch.channels_last)
    state.device = torch.device("cpu")
    images[:, :, 0, 0] = 255
    inputs, _, _ = task.batch((images, labels), state)  # the constants follow the images back to the CPU
    assert inputs.is_contiguous(memory_format=torch.channels_last)
    assert inputs[0, :, 0, 0].tolist() == [1.0, 3.0, 1.0] and inputs[0, :, 1, 1].tolist() == [-1.0, -1.0, 0.0]


def test_masked_token_metrics_accumulate_over_batches_and_ranks(monkeypatch):
    torch.manual_seed(0)
    evaluator = MaskedLanguageModeling().evaluator(SimpleNamespace(device=torch.device("cpu"), world_size=1))
    assert evaluator.sums.dtype == torch.float64
    batches = []
    for _ in range(2):
        logits, labels = torch.randn(2, 4, 7), torch.full((2, 4), IGNORED)
        labels[0, 1], labels[1, 2] = 3, int(logits[1, 2].argmax())
        batches.append((logits, labels))
        evaluator.update(logits, {"labels": labels})
    picked = torch.cat([b[0][b[1] != IGNORED] for b in batches])
    targets = torch.cat([b[1][b[1] != IGNORED] for b in batches])
    loss = float(F.cross_entropy(picked, targets))
    metrics = evaluator.compute()
    assert metrics["masked_accuracy"] == pytest.approx(float((picked.argmax(-1) == targets).float().mean()))
    assert metrics["eval_loss"] == pytest.approx(loss, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
    other = AnotherRank([30.0, 2.0, 6.0])  # rank 1: 6 masked tokens, 2 right, loss 30
    monkeypatch.setattr(dist, "all_reduce", other)
    ranks = MaskedTokenEvaluator(torch.device("cpu"), world_size=2)
    ranks.update(batches[0][0], {"labels": batches[0][1]})
    own = F.cross_entropy(
        batches[0][0][batches[0][1] != IGNORED], batches[0][1][batches[0][1] != IGNORED], reduction="sum"
    )
    correct = int((batches[0][0][batches[0][1] != IGNORED].argmax(-1) == batches[0][1][batches[0][1] != IGNORED]).sum())
    reduced = ranks.compute()
    assert reduced["eval_loss"] == pytest.approx((float(own) + 30.0) / 8)
    assert reduced["masked_accuracy"] == pytest.approx((correct + 2) / 8)
    empty = MaskedTokenEvaluator(torch.device("cpu"), world_size=1).compute()  # no masked token at all
    assert all(math.isnan(value) for value in (empty["masked_accuracy"], empty["eval_loss"]))


def test_an_exploding_loss_has_infinite_perplexity_not_an_overflow():
    evaluator = MaskedTokenEvaluator(torch.device("cpu"), world_size=1)
    logits = torch.full((1, 2, 5), -100.0)
    logits[0, 0, 0] = 100.0  # certain of the wrong token: loss 200
    evaluator.update(logits, {"labels": torch.tensor([[3, IGNORED]])})
    metrics = evaluator.compute()
    assert metrics["eval_loss"] == pytest.approx(200.0) and metrics["perplexity"] == math.inf
    evaluator = MaskedTokenEvaluator(torch.device("cpu"), world_size=1)
    evaluator.update(torch.tensor([[[50.5, 0.0]]]), {"labels": torch.tensor([[1]])})  # loss 50.5: past the cut-off
    assert evaluator.compute()["perplexity"] == math.inf


def test_perplexity_is_finite_below_a_mean_loss_of_50_and_infinite_from_50_on():
    assert token_loss_metrics(99.8, 2.0) == {"eval_loss": 49.9, "perplexity": math.exp(49.9)}
    assert token_loss_metrics(100.0, 2.0) == {"eval_loss": 50.0, "perplexity": math.inf}


def test_the_token_losses_sum_only_the_predicted_tokens():
    labels = torch.tensor([[3, IGNORED, 7, IGNORED], [IGNORED, IGNORED, IGNORED, 0]])
    assert int(MaskedLanguageModeling().loss_terms({"labels": labels})) == 3


def test_text_batches_go_to_the_device_with_their_labels_and_real_token_counts_stay_on_the_host():
    from trainrun.data.masked_text import collate_masked

    sample = {
        "input_ids": torch.tensor([2, 7, 3, 0]),
        "attention_mask": torch.tensor([1, 1, 1, 0]),
        "labels": torch.tensor([IGNORED, 7, IGNORED, IGNORED]),
        "predict_positions": torch.tensor([1]),
    }
    batch = collate_masked([sample])
    inputs, targets, count = MaskedLanguageModeling().batch(batch, SimpleNamespace(device=torch.device("meta")))
    assert set(inputs) == {"input_ids", "attention_mask", "predict_positions", "lengths", "predict_counts"}
    assert set(targets) == {"labels", "predicted", "counts"} and count == 1
    moved = [inputs[key] for key in ("input_ids", "attention_mask", "predict_positions")]
    moved += [targets["labels"], targets["predicted"]]
    assert {t.device.type for t in moved} == {"meta"}
    assert (
        inputs["lengths"].device.type == inputs["predict_counts"].device.type == targets["counts"].device.type == "cpu"
    )
    assert inputs["lengths"].tolist() == [3] and inputs["predict_counts"].tolist() == [1]
    labels = scored_labels(torch.empty(1, 8, device="meta"), targets)  # as with a model on a GPU
    assert labels.device.type == "meta" and labels.shape == (1,)


def test_a_finished_bert_run_is_exported_for_transformers_with_its_caveats(tmp_path):
    from trainrun.algorithms.gated_linear_units import apply_glu
    from trainrun.algorithms.specs.gated_linear_units import GatedLinearUnitsConfig
    from trainrun.data.store_writer import write_token_store
    from trainrun.models.bert import build_bert
    from trainrun.schema import BertConfig

    documents = ["a short document about tokens", "another document, a little longer than the first"] * 10
    store = write_token_store(documents, documents[:2], tmp_path / "store", vocab_size=80)
    model = build_bert(BertConfig(layers=1, hidden_size=16, heads=2, intermediate_size=32), 80)
    state = SimpleNamespace(
        raw_model=model, data=SimpleNamespace(text=SimpleNamespace(tokenizer_file=store / "tokenizer.json"))
    )
    lines = MaskedLanguageModeling().export(state, tmp_path / "run")
    folder = tmp_path / "run" / "hf_model"
    assert lines == [f"wrote {folder} (BertForMaskedLM and its tokenizer, for transformers' from_pretrained)"]
    assert (folder / "config.json").is_file()
    vocabulary = json.loads((store / "tokenizer.json").read_text())["model"]["vocab"]
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"] == vocabulary  # the run's own
    apply_glu(model, GatedLinearUnitsConfig(), std=0.02)
    lines = MaskedLanguageModeling().export(state, tmp_path / "glu")
    assert lines[1] == (
        "note: hf_model: its feed-forward layers are GLUs (gated_linear_units), which BertForMaskedLM cannot load"
    )
