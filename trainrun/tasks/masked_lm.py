"""Masked-language-model pretraining: predict the masked tokens; masked-token accuracy as quality.

Batches are dicts of ``input_ids``, ``attention_mask`` and ``labels`` (-100 where a token is not
predicted) from :mod:`trainrun.data.masked_text`. The loss is the cross-entropy over the masked
tokens of the batch, in fp32; evaluation reports the masked-token accuracy, the mean
cross-entropy per masked token (``eval_loss``) and its exponential, the perplexity, each summed
over every rank's masked tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainrun.core.state import State
from trainrun.data.interface import TextFacts
from trainrun.data.masked_text import IGNORED, predicted_slots
from trainrun.schema import DataConfig, TrainConfig
from trainrun.tasks.base import Evaluator, LossFunction, SequenceTask, token_loss_metrics


def masked_cross_entropy(logits: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the predicted tokens, in fp32. ``logits`` are every position's
    (batch, sequence, vocabulary), scored against ``targets["labels"]``, or the predicted rows'
    alone (predictions, vocabulary; in evaluation and with masked_head), against
    ``targets["predicted"]``; -100 marks what is not scored either way, so nothing is read back
    from the device."""
    return F.cross_entropy(logits.flatten(0, -2).float(), scored_labels(logits, targets), ignore_index=IGNORED)


def scored_labels(logits: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
    """The labels ``logits`` are scored against, flat: every position's, or the predicted rows'
    (their slots taken by the host's ``counts`` when the targets carry them)."""
    if logits.dim() == 3:
        return targets["labels"].flatten()
    predicted = targets["predicted"]
    if "counts" not in targets:
        return predicted.flatten()
    return predicted.flatten().index_select(0, predicted_slots(targets["counts"], predicted.shape[1], predicted.device))


class MaskedTokenEvaluator(Evaluator):
    def __init__(self, device: torch.device, world_size: int) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, masked tokens
        self.world_size = world_size

    def update(self, outputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> None:
        labels = scored_labels(outputs, targets)
        logits, scored = outputs.flatten(0, -2).float(), labels != IGNORED
        self.sums[0] += F.cross_entropy(logits, labels, ignore_index=IGNORED, reduction="sum")
        self.sums[1] += ((logits.argmax(-1) == labels) & scored).sum()
        self.sums[2] += scored.sum()

    def compute(self) -> dict[str, float]:
        if self.world_size > 1:
            dist.all_reduce(self.sums)
        loss, correct, count = (float(value) for value in self.sums)
        return {"masked_accuracy": correct / count if count else float("nan"), **token_loss_metrics(loss, count)}


class MaskedLanguageModeling(SequenceTask):
    name = "masked_lm"
    metrics = {"masked_accuracy": "masked-token accuracy"}
    unit = "seq"
    host_keys = ("lengths", "predict_counts", "counts")  # what batch leaves on the host: counts it reads

    def batch(self, batch: Any, state: State) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        """Inputs (``lengths`` stays on the host) and targets of a :func:`~trainrun.data.masked_text.
        collate_masked` batch; the model predicts every position or, in evaluation and with
        masked_head, the predicted slots alone."""

        def moved(key: str) -> torch.Tensor:
            return batch[key].to(state.device, non_blocking=True)

        inputs = {key: moved(key) for key in ("input_ids", "attention_mask", "predict_positions")}
        inputs["lengths"], inputs["predict_counts"] = batch["lengths"], batch["predict_counts"]  # host counts
        targets = {"labels": moved("labels"), "predicted": moved("predicted_labels"), "counts": batch["predict_counts"]}
        return inputs, targets, len(batch["labels"])

    def example_batch(self, config: TrainConfig, size: int, text: TextFacts) -> dict[str, torch.Tensor]:
        """``size`` sequences of ``text.max_seq_len`` positions, ``text.real_token_share`` of them
        tokens and the rest padding, with ``data.text.mlm_probability`` of the tokens masked and
        predicted, collated as the loader collates them (values arbitrary: what trainrun estimate runs)."""
        from trainrun.data.masked_text import collate_masked

        width = text.max_seq_len
        length = max(2, min(width, round(text.real_token_share * width)))
        predicted = max(1, round(config.data.text.mlm_probability * length))
        mask = (torch.arange(width) < length).to(torch.int64)
        sample = {
            "input_ids": torch.randint(text.vocab_size, (width,)) * mask,
            "attention_mask": mask,
            "labels": torch.full((width,), IGNORED),
            "predict_positions": torch.arange(1, predicted + 1),
        }
        sample["labels"][sample["predict_positions"]] = 1
        return collate_masked([sample] * size)

    def real_token_share(self, config: TrainConfig) -> float:
        """The share of a training sample's positions that hold tokens, from the store at ``data.path``."""
        from trainrun.data.masked_text import MaskedSequences
        from trainrun.data.token_store import TokenStore

        text = config.data.text
        store = TokenStore.open(config.data.path, "train")
        return MaskedSequences(store, text.max_seq_len, text.packing, text.mlm_probability).real_token_share()

    def sequence_length(self, inputs: dict) -> int:
        return inputs["input_ids"].shape[1]

    def truncate(self, inputs: dict, targets: dict, length: int) -> tuple[dict, dict]:
        """The batch with every sequence cut to its first ``length`` tokens (sequence-length
        warmup): positions cut off are not predicted (their slots stay, scored as -100: the host
        cannot count them without reading the device)."""
        kept = inputs["predict_positions"] < length
        inputs = {
            **inputs,
            **{key: inputs[key][:, :length] for key in ("input_ids", "attention_mask")},
            "lengths": inputs["lengths"].clamp(max=length),
            "predict_positions": torch.where(kept, inputs["predict_positions"], 0),
        }
        targets = {
            **targets,
            "labels": targets["labels"][:, :length],
            "predicted": torch.where(kept, targets["predicted"], IGNORED),
        }
        return inputs, targets

    def without_repeats(self, outputs: torch.Tensor, targets: dict, scored: int, size: int) -> tuple[Any, dict]:
        """The repeated samples' tokens unscored (their labels -100): a masked head's outputs hold a
        row per predicted token, not per sample, so they are kept as they are."""
        unscored = {key: targets[key].clone() for key in ("labels", "predicted")}
        for labels in unscored.values():
            labels[scored:] = IGNORED
        return outputs, {**targets, **unscored}

    def loss(self, name: str) -> LossFunction:
        return masked_cross_entropy

    def loss_terms(self, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """The predicted tokens (what is cut off by sequence-length warmup is not)."""
        return (targets["labels"] != IGNORED).sum()

    def evaluator(self, state: State) -> MaskedTokenEvaluator:
        return MaskedTokenEvaluator(state.device, state.world_size)

    def startup_notes(self, state: State) -> list[str]:
        """Which fused attention kernel the device gives this run's BERT at the data's length."""
        if not hasattr(state.raw_model, "attention_kernels"):  # a model a user brings chooses its own
            return []
        dtype = state.precision.dtype or torch.float32
        kernels = state.raw_model.attention_kernels(state.data.text.max_seq_len, dtype, state.device)
        return [f"attention: {kernels}"]

    def export(self, state: State, run_dir: Path) -> list[str]:
        """``<run>/hf_model``: the BERT (or the transformers model a user brought) and the tokenizer for
        ``transformers``' ``from_pretrained``."""
        from trainrun.models.weights import export_pretrained

        directory, text = run_dir / "hf_model", state.data.text
        if hasattr(state.raw_model, "export_pretrained"):  # a transformers model a user brings: its own class
            state.raw_model.export_pretrained(text.tokenizer_file, text.separator, directory)
            written = state.raw_model.transformers_class
            return [f"wrote {directory} ({written} and its tokenizer, for transformers' from_pretrained)"]
        if not hasattr(state.raw_model, "bert"):  # a module of the user's own
            return [
                f"note: no {directory.name} (the model has no transformers class); the checkpoints hold its weights"
            ]
        caveats = export_pretrained(state.raw_model, text.tokenizer_file, directory)
        lines = [f"wrote {directory} (BertForMaskedLM and its tokenizer, for transformers' from_pretrained)"]
        return lines + [f"note: {directory.name}: {caveat}" for caveat in caveats]


def build(data: DataConfig | None = None) -> MaskedLanguageModeling:
    return MaskedLanguageModeling()
