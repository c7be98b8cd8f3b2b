"""A ``torch.nn.Module`` of the user's own (``model=module model.target=package.module.Name``),
imported from the working directory or ``PYTHONPATH`` and built with ``model.kwargs``; the run's own
facts (``num_classes``, ``vocab_size``, ``max_seq_len``) are passed where its class takes them by
those names and ``model.kwargs`` does not set them."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from torch import nn

from trainrun.data.interface import TextFacts
from trainrun.errors import ConfigError
from trainrun.schema import ModelConfig


def imported(target: str) -> Any:
    """The object ``target`` (``package.module.Name``) names, the working directory importable as a
    ``python -m`` run's is; one line naming ``model.target`` where it does not import."""
    module_name, _, name = target.rpartition(".")
    if not module_name:
        raise ConfigError(f"bad value for 'model.target': '{target}' is not package.module.Name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may raise anything as it imports
        raise ConfigError(
            f"bad value for 'model.target': '{target}' does not import ({type(error).__name__}: {error})"
        ) from None
    found = getattr(module, name, None)
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        what = "nothing" if found is None else f"a {type(found).__name__}, not a torch.nn.Module class"
        raise ConfigError(f"bad value for 'model.target': '{target}' names {what}")
    return found


def source_file(target: str) -> dict[str, str] | None:
    """The file ``target``'s class is defined in and its SHA-256 (a run's provenance)."""
    path = inspect.getsourcefile(imported(target))
    if path is None:
        return None
    return {"file": str(Path(path).resolve()), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}


def run_facts(model_class: type, config: ModelConfig, text: TextFacts | None) -> dict[str, Any]:
    """The run's facts that ``model_class`` takes by name and ``model.kwargs`` leaves unset."""
    facts = {"num_classes": config.num_classes}
    if text is not None:
        facts |= {"vocab_size": text.vocab_size, "max_seq_len": text.max_seq_len}
    taken = inspect.signature(model_class).parameters
    return {key: value for key, value in facts.items() if key in taken and key not in config.kwargs}


def build(config: ModelConfig, text: TextFacts | None = None) -> nn.Module:
    """``model=module``: ``model.target``'s class built with the run's facts and ``model.kwargs``."""
    model_class = imported(config.target)
    return model_class(**run_facts(model_class, config, text), **config.kwargs)
