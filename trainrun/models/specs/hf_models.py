"""The spec of ``model=transformers``: any architecture transformers builds from a config
(trainrun/models/hf_models.py)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from trainrun.errors import ConfigError
from trainrun.models.specs import brought_kind, refuse_initializers, refused_arguments

TASK_HEADS = {"causal_lm": "ForCausalLM", "masked_lm": "ForMaskedLM"}


def model_type(config: Any) -> str:
    """The architecture's model type: ``model.arch``, or ``model.path``'s ``config.json``'s (the two agree
    where both are given)."""
    model = config.model
    if not model.path:
        if not model.arch:
            raise ConfigError("bad value for 'model.arch': model=transformers needs a model type (qwen3) or model.path")
        return model.arch
    described = Path(model.path).expanduser() / "config.json"
    try:
        found = json.loads(described.read_text()).get("model_type")
    except (OSError, ValueError) as error:
        raise ConfigError(f"bad value for 'model.path': '{described}' cannot be read as JSON ({error})") from None
    if model.arch and model.arch != found:
        raise ConfigError(f"bad value for 'model.arch': '{model.arch}', but {described} is a {found}")
    return found


def check(config: Any) -> None:
    """A model type transformers knows (else the closest), with a head for the run's task, settings its
    config has (else the closest), and a build its classes accept (else their own message, one line);
    the data's sequences within its positions."""
    from transformers import CONFIG_MAPPING

    from trainrun.models.found import meta_model
    from trainrun.models.hf_models import AUTO_CLASSES, auto_class

    refuse_initializers(config, "transformers' own, as each architecture defines it")
    kind = model_type(config)
    if kind not in CONFIG_MAPPING:
        closest = difflib.get_close_matches(kind, list(CONFIG_MAPPING.keys()), n=5, cutoff=0.6)
        hint = f"; closest: {', '.join(closest)}" if closest else ""
        raise ConfigError(f"bad value for 'model.arch': '{kind}' is not a model type transformers knows{hint}")
    head = config.model.head
    if head not in AUTO_CLASSES:
        raise ConfigError(f"bad value for 'model.head': '{head}' (choose from: {', '.join(AUTO_CLASSES)})")
    defaults = CONFIG_MAPPING[kind]().to_dict() | getattr(CONFIG_MAPPING[kind], "attribute_map", {})
    for key in config.model.config:  # its settings, or the common names it maps to them (GPT-2's n_layer)
        if key not in defaults:
            closest = difflib.get_close_matches(key, list(defaults), n=3, cutoff=0.6)
            hint = f" (closest: {', '.join(closest)})" if closest else ""
            raise ConfigError(f"bad value for 'model.config.{key}': {kind}'s config has no such setting{hint}")
    if type(CONFIG_MAPPING[kind]()) not in auto_class(head)._model_mapping:
        raise ConfigError(
            f"bad value for 'model.arch': transformers has no {AUTO_CLASSES[head]} for {kind} "
            f"(task {config.task.name} needs a {TASK_HEADS[head]} head)"
        )
    with refused_arguments("model.config", f"transformers' {kind}"):
        model = meta_model(config)
    positions = getattr(model.model.config, "max_position_embeddings", None)
    if positions is not None and config.data.text.max_seq_len > positions:
        raise ConfigError(
            f"bad value for 'data.text.max_seq_len': {config.data.text.max_seq_len} is more than the model's "
            f"{positions} positions (model.config.max_position_embeddings)"
        )


def published_vocab(config: Any) -> int:
    """The architecture's own vocabulary (``model.path``'s config.json or ``model.arch``'s defaults)."""
    from transformers import AutoConfig

    if config.model.path:
        return AutoConfig.from_pretrained(Path(config.model.path).expanduser(), local_files_only=True).vocab_size
    return AutoConfig.for_model(model_type(config), **config.model.config).vocab_size


SPECS = (
    brought_kind(
        "transformers", "trainrun.models.hf_models:build", "token_windows", check,
        also_speaks=("masked_text",), published_vocab=published_vocab,
    ),
)  # fmt: skip
