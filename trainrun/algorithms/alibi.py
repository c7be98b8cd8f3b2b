"""ALiBi (Press et al., 2021): attention biased by distance instead of learned positions.

Each head ``h`` adds ``-m_h * |i - j|`` to its attention scores between positions ``i`` and
``j`` (the symmetric form bidirectional encoders use, as Mosaic BERT), with slopes
``m_h = 2^(-8h/n)`` for ``n`` heads a power of two; otherwise the power-of-two set for the largest
power below ``n`` and then the odd-indexed slopes of the set for twice it. At INIT the model's
model's ``use_alibi(max_sequence_length)`` drops its learned positions and attends with the bias:
trainrun's BERT (:class:`~trainrun.models.bert.MaskedLanguageModel`: a frozen zero position table
of ``max_sequence_length`` rows, so sequences longer than those trained on still run) and GPT
(:class:`~trainrun.models.gpt.GPT`, whose bias is the causal form ``-m_h · (i - j)``, j ≤ i).

With ``train_sequence_length_scaling`` s below 1 (Composer's GPT setting: 0.25; causal tasks),
every training batch of (batch, length) tokens is reshaped at AFTER_DATALOADER into (batch / s,
length · s): the same tokens in shorter sequences, so attention costs s of a full step's, while
evaluation reads whole sequences, to which ALiBi extrapolates.
"""

from __future__ import annotations

import torch

from trainrun.algorithms.specs.alibi import AlibiConfig
from trainrun.core.engine import Algorithm
from trainrun.core.events import Event
from trainrun.core.state import State
from trainrun.errors import ConfigError
from trainrun.models.capabilities import AlibiAttention


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
        self.rebuild(state.raw_model)

    def rebuild(self, model: torch.nn.Module) -> None:
        if not isinstance(model, AlibiAttention):
            raise ConfigError(
                f"algorithm 'alibi' needs trainrun's BERT or GPT (model=bert_*, gpt*), not {type(model).__name__}"
            )
        model.use_alibi(self.config.max_sequence_length)
