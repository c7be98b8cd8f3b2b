"""The spec of ``model=bert_*``: Hugging Face's BertForMaskedLM (trainrun/models/bert.py)."""

from __future__ import annotations

from typing import Any

from trainrun.algorithms.specs import sequence_limit
from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec
from trainrun.models.specs import refuse_initializers


def check(config: Any) -> None:
    """Sequences within the positions the model has (or a method gives it), heads that divide its width."""
    refuse_initializers(config, "Hugging Face BERT's normal(0, initializer_range)")
    positions, key = sequence_limit(config.algorithms) or (
        config.model.bert.max_position_embeddings,
        "model.bert.max_position_embeddings",
    )
    if config.data.text.max_seq_len > positions:
        raise ConfigError(
            f"bad value for 'data.text.max_seq_len': {config.data.text.max_seq_len} is more than the model's "
            f"{positions} positions ({key})"
        )
    bert = config.model.bert
    if bert.hidden_size % bert.heads:
        raise ConfigError(
            f"bad value for 'model.bert.heads': {bert.heads} does not divide model.bert.hidden_size {bert.hidden_size}"
        )


SPECS = (
    KindSpec(
        name="bert",
        builder="trainrun.models.bert:build",
        batches="masked_text",
        offers=frozenset(
            {
                Capability.ALIBI,
                Capability.UNPADDING,
                Capability.MASKED_HEAD,
                Capability.ENCODER_LAYERS,
                Capability.HIDDEN_MATRICES,
            }
        ),
        check=check,
        published_vocab=30_522,  # BERT's WordPiece (bert-base-uncased)
    ),
)
