"""The spec of ``model=timm``: any architecture in timm's registry (trainrun/models/timm_models.py)."""

from __future__ import annotations

import difflib
from typing import Any

from trainrun.errors import ConfigError
from trainrun.models.specs import brought_kind, refuse_initializers, refused_arguments


def check(config: Any) -> None:
    """``model.arch`` names an architecture in timm's registry (else the closest names), which builds
    with the run's classes, side and ``model.kwargs`` (else timm's own message, in one line)."""
    from trainrun.models.found import check_outputs, meta_model
    from trainrun.models.timm_models import timm_library

    timm = timm_library()

    refuse_initializers(config, "timm's own, as each architecture defines it")
    arch = config.model.arch
    if not arch:
        raise ConfigError("bad value for 'model.arch': model=timm needs a name from timm.list_models() (convnext_tiny)")
    if not timm.is_model(arch):
        closest = difflib.get_close_matches(arch, timm.list_models(), n=5, cutoff=0.6)
        hint = f"; closest: {', '.join(closest)}" if closest else ""
        raise ConfigError(f"bad value for 'model.arch': '{arch}' is not in timm's registry{hint}")
    with refused_arguments("model.kwargs", f"timm.create_model('{arch}')"):
        meta_model(config)
    check_outputs(config, "model.arch")


SPECS = (brought_kind("timm", "trainrun.models.timm_models:build", "images", check),)
