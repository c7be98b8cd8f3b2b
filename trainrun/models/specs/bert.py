"""The spec of ``model=bert_*``: Hugging Face's BertForMaskedLM (trainrun/models/bert.py)."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.kinds import Capability, KindSpec
from trainrun.models.specs import refuse_initializers


def check(config: Any) -> None:
    """Heads that divide its width (its sequences: :func:`positions`, which validation holds them to)."""
    refuse_initializers(config, "Hugging Face BERT's normal(0, initializer_range)")
    bert = config.model.bert
    if bert.hidden_size % bert.heads:
        raise ConfigError(
            f"bad value for 'model.bert.heads': {bert.heads} does not divide model.bert.hidden_size {bert.hidden_size}"
        )


def positions(config: Any) -> tuple[int, str]:
    """Its learned position embeddings."""
    return config.model.bert.max_position_embeddings, "model.bert.max_position_embeddings"


SPECS = (
    KindSpec(
        name="bert",
        builder="trainrun.models.bert:build",
        family="bert",
        batches="masked_text",
        offers=frozenset(
            {
                Capability.ALIBI,
                Capability.UNPADDING,
                Capability.MASKED_HEAD,
                Capability.ENCODER_LAYERS,
                Capability.FEED_FORWARDS,
                Capability.LAYER_NORMS,
                Capability.HIDDEN_MATRICES,
            }
        ),
        check=check,
        positions=positions,
        published_vocab=30_522,  # BERT's WordPiece (bert-base-uncased)
    ),
)
