"""The spec of ``task=causal_lm``: every next token predicted, the validation loss as quality."""

from __future__ import annotations

from trainrun.kinds import Capability, TaskSpec
from trainrun.quality import Quality

SPECS = (
    TaskSpec(
        name="causal_lm",
        builder="trainrun.tasks.causal_lm:build",
        batches="token_windows",
        offers=frozenset({Capability.SEQUENCES, Capability.CAUSAL_SEQUENCES}),
        quality=Quality("eval_loss", "validation loss", higher_is_better=False, percent=False),
    ),
)
