"""Causal-language-model pretraining: predict every next token; the validation loss is the quality,
and lower is better.

Batches are (batch, max_seq_len + 1) token windows from :mod:`trainrun.data.causal_text`: the
model reads the first ``max_seq_len`` tokens and is scored on the next token at each position, in
fp32. Evaluation sums the cross-entropy and the token count over every rank's windows (a fixed,
sequential set), so ``eval_loss`` is the mean per token and ``perplexity`` its exponential.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainrun.core.state import State
from trainrun.data.interface import TextFacts
from trainrun.schema import DataConfig, TrainConfig
from trainrun.tasks.base import Evaluator, LossFunction, SequenceTask, token_loss_metrics
from trainrun.tasks.losses import summed_cross_entropy


def next_token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (batch, length, vocabulary) against the next tokens, in fp32,
    in chunks of positions (:func:`summed_cross_entropy`)."""
    return summed_cross_entropy(logits.flatten(0, 1), targets.flatten()) / targets.numel()


class NextTokenEvaluator(Evaluator):
    """Summed cross-entropy and tokens, per corpus where validation batches say each window's
    (``{"next", "source"}`` targets of a mixture): ``eval_loss/<corpus>`` each, and ``eval_loss``
    their mean weighted by the corpora's shares of training."""

    def __init__(self, device: torch.device, world_size: int, text: TextFacts | None = None) -> None:
        self.sources = text.sources if text is not None else ()
        self.weights = text.source_weights if text is not None else ()
        self.sums = torch.zeros(max(1, len(self.sources)), 2, dtype=torch.float64, device=device)  # loss, tokens
        self.world_size = world_size

    def update(self, outputs: torch.Tensor, targets: torch.Tensor | dict[str, torch.Tensor]) -> None:
        if not isinstance(targets, dict):
            self.sums[0, 0] += summed_cross_entropy(outputs.flatten(0, 1), targets.flatten())
            self.sums[0, 1] += targets.numel()
            return
        next_tokens, sources = targets["next"], targets["source"]
        for source in sources.unique().tolist():
            rows = sources == source
            self.sums[source, 0] += summed_cross_entropy(outputs[rows].flatten(0, 1), next_tokens[rows].flatten())
            self.sums[source, 1] += next_tokens[rows].numel()

    def compute(self) -> dict[str, float]:
        if self.world_size > 1:
            dist.all_reduce(self.sums)
        if not self.sources:
            return token_loss_metrics(*(float(value) for value in self.sums[0]))
        means = {name: token_loss_metrics(float(loss), float(tokens))["eval_loss"]
                 for name, (loss, tokens) in zip(self.sources, self.sums, strict=True)}  # fmt: skip
        mixed = sum(weight * mean for weight, mean in zip(self.weights, means.values(), strict=True))
        return {**token_loss_metrics(mixed, 1.0), **{f"eval_loss/{name}": mean for name, mean in means.items()}}


class CausalLanguageModeling(SequenceTask):
    name = "causal_lm"
    metrics = {"eval_loss": "validation loss"}
    unit = "seq"
    loss_compiles = True  # a vocabulary's logits at every position: the step's largest tensor

    def batch(self, batch: Any, state: State) -> tuple[torch.Tensor, Any, int]:
        """Inputs and next tokens of a batch of windows; of a mixture's validation batch, the next
        tokens with each window's corpus (``{"next", "source"}``)."""
        if isinstance(batch, dict):
            windows = batch["windows"].to(state.device, non_blocking=True)
            sources = batch["source"].to(state.device, non_blocking=True)
            return windows[:, :-1], {"next": windows[:, 1:], "source": sources}, len(windows)
        windows = batch.to(state.device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:], len(windows)

    def example_batch(self, config: TrainConfig, size: int, text: TextFacts) -> torch.Tensor:
        """``size`` windows of ``text.max_seq_len + 1`` token ids, as the loader gives them (values
        arbitrary: what trainrun estimate runs)."""
        return torch.randint(text.vocab_size, (size, text.max_seq_len + 1))

    def sequence_length(self, inputs: torch.Tensor) -> int:
        return inputs.shape[1]

    def truncate(self, inputs: torch.Tensor, targets: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each window's first ``length`` tokens and their next tokens (causal: nothing later is read)."""
        return inputs[:, :length], targets[:, :length]

    def split(self, inputs: torch.Tensor, targets: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each window cut into consecutive pieces of ``length`` tokens, each a sequence of its own
        (ALiBi's shorter training sequences): the same tokens, the tail that fills no piece left out."""
        pieces = inputs.shape[1] // length
        kept = pieces * length
        return inputs[:, :kept].reshape(-1, length), targets[:, :kept].reshape(-1, length)

    def loss(self, name: str) -> LossFunction:
        return next_token_cross_entropy

    def evaluator(self, state: State) -> NextTokenEvaluator:
        return NextTokenEvaluator(state.device, state.world_size, state.data.text)

    def export(self, state: State, run_dir: Path) -> list[str]:
        """``<run>/hf_model``: the model as its ``transformers`` class (GPT-2's, Llama's) and its tokenizer."""
        directory, text = run_dir / "hf_model", state.data.text
        if text.tokenizer_file is None:
            unset = "no tokenizer: set data.shards.tokenizer to the shards' tokenizer.json"
            return [f"note: no {directory.name} ({unset})"]
        if not hasattr(state.raw_model, "export_pretrained"):  # a module of the user's own
            return [
                f"note: no {directory.name} (the model has no transformers class); the checkpoints hold its weights"
            ]
        unwritten = state.raw_model.export_pretrained(text.tokenizer_file, text.separator, directory)
        if unwritten:
            return [f"note: no {directory.name} ({unwritten}); 'trainrun sample' reads the run"]
        written = state.raw_model.transformers_class
        return [f"wrote {directory} ({written} and its tokenizer, for transformers' from_pretrained)"]


def build(data: DataConfig | None = None) -> CausalLanguageModeling:
    return CausalLanguageModeling()
