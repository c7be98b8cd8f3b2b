"""The spec of ``task=masked_lm``: masked tokens predicted, masked-token accuracy as quality."""

from __future__ import annotations

from trainrun.kinds import Capability, TaskSpec
from trainrun.quality import Quality

SPECS = (
    TaskSpec(
        name="masked_lm",
        builder="trainrun.tasks.masked_lm:build",
        batches="masked_text",
        offers=frozenset({Capability.SEQUENCES}),
        quality=Quality("masked_accuracy", "masked-token accuracy"),
    ),
)
