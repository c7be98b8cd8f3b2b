"""Masked-language-model pretraining: predict the masked tokens; masked-token accuracy as quality.

Batches are dicts of ``input_ids``, ``attention_mask`` and ``labels`` (-100 where a token is not
predicted) from :mod:`trainrun.data.masked_text`. The loss is the cross-entropy over the masked
tokens of the batch, in fp32; evaluation reports the masked-token accuracy, the mean
cross-entropy per masked token (``eval_loss``) and its exponential, the perplexity, each summed
over every rank's masked tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainrun.core.state import State
from trainrun.data.masked_text import IGNORED
from trainrun.tasks import Evaluator, LossFunction, Task


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the tokens whose label is not -100, in fp32. ``logits`` are every
    position's (batch, sequence, vocabulary) or the masked positions' alone (positions, vocabulary)."""
    if logits.dim() == labels.dim():  # the masked positions' logits only (algorithm masked_head)
        labels = labels[labels != IGNORED]
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORED)


class MaskedTokenEvaluator(Evaluator):
    def __init__(self, device: torch.device, world_size: int) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, masked tokens
        self.world_size = world_size

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        chosen = targets != IGNORED
        logits, labels = outputs[chosen].float(), targets[chosen]
        self.sums[0] += F.cross_entropy(logits, labels, reduction="sum")
        self.sums[1] += (logits.argmax(-1) == labels).sum()
        self.sums[2] += len(labels)

    def compute(self) -> dict[str, float]:
        if self.world_size > 1:
            dist.all_reduce(self.sums)
        loss, correct, count = (float(value) for value in self.sums)
        mean = loss / count if count else float("nan")
        return {
            "masked_accuracy": correct / count if count else float("nan"),
            "eval_loss": mean,
            "perplexity": math.exp(mean) if mean < 50 else float("inf"),
        }


class MaskedLanguageModeling(Task):
    name = "masked_lm"
    quality = "masked_accuracy"
    metrics = {"masked_accuracy": "masked-token accuracy"}
    unit = "seq"

    def batch(self, batch: Any, state: State) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
        inputs = {key: batch[key].to(state.device, non_blocking=True) for key in ("input_ids", "attention_mask")}
        return inputs, batch["labels"].to(state.device, non_blocking=True), len(batch["labels"])

    def loss(self, name: str) -> LossFunction:
        return masked_cross_entropy

    def evaluator(self, state: State) -> MaskedTokenEvaluator:
        return MaskedTokenEvaluator(state.device, state.world_size)

    def export(self, state: State, run_dir: Path) -> list[str]:
        """``<run>/hf_model``: the BERT and tokenizer for ``transformers``' ``from_pretrained``."""
        from trainrun.models.weights import export_pretrained

        directory = run_dir / "hf_model"
        caveats = export_pretrained(state.raw_model, state.data.tokenizer_file, directory)
        lines = [f"wrote {directory} (BertForMaskedLM and its tokenizer, for transformers' from_pretrained)"]
        return lines + [f"note: {directory.name}: {caveat}" for caveat in caveats]


def build() -> MaskedLanguageModeling:
    return MaskedLanguageModeling()
