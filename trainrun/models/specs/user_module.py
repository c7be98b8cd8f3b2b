"""The spec of ``model=module``: a ``torch.nn.Module`` of the user's own (trainrun/models/user_module.py),
for any task whose batches it takes."""

from __future__ import annotations

from typing import Any

from trainrun.errors import ConfigError
from trainrun.models.specs import brought_kind, refuse_initializers, refused_arguments


def check(config: Any) -> None:
    """``model.target`` imports and is a Module class, which builds with ``model.kwargs`` (else its own
    message, one line) and returns what the run's task scores for a batch of its inputs."""
    from trainrun.models.found import check_outputs, meta_model

    refuse_initializers(config, "its own")
    if not config.model.target:
        raise ConfigError("bad value for 'model.target': model=module needs package.module.Name, a torch.nn.Module")
    with refused_arguments("model.kwargs", config.model.target):
        meta_model(config)
    check_outputs(config, "model.target")


SPECS = (
    brought_kind(
        "module", "trainrun.models.user_module:build", "images", check,
        also_speaks=("token_windows", "masked_text", "volumes"),
    ),
)  # fmt: skip
