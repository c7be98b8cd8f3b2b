"""ALiBi (Press et al., 2021): attention biased by distance instead of learned positions.

Each head ``h`` adds ``-m_h * |i - j|`` to its attention scores between positions ``i`` and
``j`` (the symmetric form bidirectional encoders use, as Mosaic BERT), with slopes
``m_h = 2^(-8h/n)`` for ``n`` heads a power of two; otherwise the power-of-two set for the largest
power below ``n`` and then the odd-indexed slopes of the set for twice it. At INIT the model's
learned position embeddings become a frozen zero table of ``max_sequence_length`` rows (so no
position is learned, and sequences longer than those trained on still run), and the model builds
the bias into the additive attention mask it hands to ``scaled_dot_product_attention``, padding
included. Works on trainrun's BERT (:class:`~trainrun.models.bert.MaskedLanguageModel`) and GPT
(:class:`~trainrun.models.gpt.GPT`, whose bias is the causal form ``-m_h · (i - j)``, j ≤ i).

With ``train_sequence_length_scaling`` s below 1 (Composer's GPT setting: 0.25; causal tasks),
every training batch of (batch, length) tokens is reshaped at AFTER_DATALOADER into (batch / s,
length · s): the same tokens in shorter sequences, so attention costs s of a full step's, while
evaluation reads whole sequences, to which ALiBi extrapolates.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainrun.algorithms.specs.alibi import AlibiConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.errors import ConfigError


def alibi_slopes(heads: int) -> torch.Tensor:
    """The per-head slopes of Press et al. (their reference rule for any number of heads)."""
    power = 2 ** math.floor(math.log2(heads))
    slopes = [2 ** (-8 * k / power) for k in range(1, power + 1)]
    # the rest: the odd-indexed slopes 2^(-8k / 2·power), k = 1, 3, 5, ... of the set for twice the power
    slopes += [2 ** (-8 * k / (2 * power)) for k in range(1, 2 * (heads - power), 2)]
    return torch.tensor(slopes)


def remove_learned_positions(model: nn.Module, max_sequence_length: int) -> None:
    """Replace the position embeddings of a Hugging Face BERT by a frozen zero table of
    ``max_sequence_length`` rows, with position and default segment ids to match."""
    embeddings = model.bert.bert.embeddings
    hidden = embeddings.position_embeddings.embedding_dim
    device = embeddings.position_embeddings.weight.device
    zeros = nn.Embedding(max_sequence_length, hidden, device=device)
    nn.init.zeros_(zeros.weight)
    zeros.weight.requires_grad_(False)
    embeddings.position_embeddings = zeros
    positions = torch.arange(max_sequence_length, device=device).expand((1, -1))
    embeddings.register_buffer("position_ids", positions, persistent=False)
    if hasattr(embeddings, "token_type_ids"):  # one (zero) segment id per position, sized as the table
        embeddings.register_buffer("token_type_ids", torch.zeros_like(positions), persistent=False)
    model.bert.config.max_position_embeddings = max_sequence_length


class Alibi(Algorithm):
    name = "alibi"
    events = frozenset({Event.INIT, Event.AFTER_DATALOADER})

    config: AlibiConfig

    def apply(self, event: Event, state: State) -> None:
        if event is Event.AFTER_DATALOADER:
            full = state.task.sequence_length(state.inputs)
            length = max(1, round(full * self.config.train_sequence_length_scaling))
            if length < full:
                state.inputs, state.targets = state.task.split(state.inputs, state.targets, length)
            return
        model = state.raw_model
        if hasattr(model, "use_alibi"):  # trainrun's GPT
            model.use_alibi()
            return
        if not hasattr(model, "alibi_slopes"):
            raise ConfigError(
                f"algorithm 'alibi' needs trainrun's BERT or GPT (model=bert_*, gpt*), not {type(model).__name__}"
            )
        remove_learned_positions(model, self.config.max_sequence_length)
        model.alibi_slopes = alibi_slopes(model.bert.config.num_attention_heads)  # a buffer: moves with the model
