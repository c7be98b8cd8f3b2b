"""A run's ``algorithms=[...]`` checked against what Hydra composes from it, before anything starts.

Hydra reads a list given for a group as the whole list (a recipe's methods are replaced, not added
to) and composes a method twice named as one; a recipe's body that sets a method's values brings it
back whatever the list says. Each of these would change the run's methods without a word, so each
is refused in one line naming what the run would get.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from trainrun import kinds
from trainrun.errors import ConfigError


def given_methods(overrides: list[str]) -> tuple[str, list[str]] | None:
    """The last ``algorithms=...`` override as typed and the methods it lists; None where there is none
    (or the overrides do not parse: composing reports that, naming the override as typed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return None
    given = [
        (typed, override.value())
        for typed, override in zip(overrides, parsed, strict=True)
        if override.key_or_group == "algorithms"
    ]
    if not given or given[-1][1] is None:
        return None
    typed, names = given[-1]
    return typed, [str(name) for name in (names if isinstance(names, list) else [names])]


def refuse_repeated_methods(overrides: list[str]) -> None:
    """``algorithms=[ema,ema]`` would compose to one EMA without a word: say so instead."""
    given = given_methods(overrides)
    names = given[1] if given else []
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        raise ConfigError(f"bad value for 'algorithms': '{repeated[0]}' is listed twice")


def refuse_dropped_methods(
    overrides: list[str], composed: DictConfig, compose_without: Callable[[list[str]], DictConfig]
) -> None:
    """``overrides``' list of methods where it is not the run's (``composed``): some of the recipe's
    methods stay, its body setting them, while others go. The recipe's own list, for the line that
    says what to write, is ``overrides`` composed without the list (``compose_without``)."""
    given = given_methods(overrides)
    if given is None:
        return
    typed, names = given
    stayed = [name for name in composed.get("algorithms") or {} if name not in names]
    if not stayed:
        return
    recipe = list(compose_without([o for o in overrides if o != typed]).get("algorithms") or {})
    gone = [name for name in recipe if name not in names and name not in stayed]
    going = f" while {', '.join(gone)} {'goes' if len(gone) == 1 else 'go'}" if gone else ""
    keeping = ",".join(dict.fromkeys([*recipe, *names]))
    raise ConfigError(
        f"bad value for 'algorithms': {typed.split('=', 1)[1]} replaces the recipe's methods, yet "
        f"{', '.join(stayed)} stay (the recipe sets them){going}: name every method the run keeps "
        f"(algorithms=[{keeping}]; ~algorithms.NAME removes one the recipe sets)"
    )


def named_methods(overrides: list[str]) -> set[str]:
    """The methods the command line names: in ``algorithms=[...]`` or by one of their settings."""
    given = given_methods(overrides)
    named = set(given[1]) if given else set()
    for override in overrides:  # algorithms.NAME.KEY=..., +algorithms/NAME=...
        if match := re.match(r"[+~]*algorithms[./](\w+)", override):
            named.add(match.group(1))
    return named


def leave_out_inapplicable(
    overrides: list[str], composed: DictConfig, validate: Callable[[DictConfig], object], notices: bool
) -> None:
    """For a model a user brings: a recipe's method that does not apply to it (the model lacks what it
    needs, or its surgery finds nothing to change) is left out of ``composed``, with a note; one the
    command line names is refused in one line naming it and the model, and so is a recipe none of
    whose methods applies (saying how to train with the rest of it: its optimizer, schedule and
    settings). ``validate``: the schema's check of a composed config."""
    from omegaconf import OmegaConf, open_dict

    from trainrun.algorithms.specs import SPECS
    from trainrun.models.found import described

    methods = dict(composed.get("algorithms") or {})
    if not methods:
        return
    bare = composed.copy()
    with open_dict(bare):
        bare.algorithms = {}
    probe = validate(bare)
    offered, named, inapplicable = kinds.offers(probe), named_methods(overrides), {}
    for name in [name for name in methods if name in SPECS]:
        if missing := SPECS[name].needs - offered:
            inapplicable[name] = f"needs {'; '.join(need.value for need in missing)}"
            continue
        params = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SPECS[name].config), methods[name] or {}))
        if finds := finds_nothing(probe, name, params):
            inapplicable[name] = f"finds no {finds}"
    for name, why in inapplicable.items():
        if name in named:
            raise ConfigError(f"algorithm '{name}' changes nothing in {described(probe)}: it {why}")
    if inapplicable and len(inapplicable) == len(methods):
        raise ConfigError(
            f"bad value for 'algorithms': none of the recipe's methods applies to {described(probe)} "
            f"({'; '.join(f'{name} {why}' for name, why in inapplicable.items())}); "
            "algorithms=[] trains with the rest of the recipe"
        )
    with open_dict(composed):
        for name, why in inapplicable.items():
            del composed.algorithms[name]
            if notices:
                print(
                    f"trainrun: note: the recipe's {name} is left out: it {why} in {described(probe)}", file=sys.stderr
                )


def finds_nothing(config: Any, name: str, params: Any) -> str | None:
    """What method ``name`` looks for (BlurPool on a ViT: strided convolutions; its one reads 3
    channels), where it changes the model by surgery and finds none of it in the run's model as built;
    None where it changes something or is not a surgery."""
    from trainrun.algorithms import method_class
    from trainrun.algorithms.base import ModelSurgery
    from trainrun.models.found import meta_model

    method = method_class(name)
    if issubclass(method, ModelSurgery) and not method.surgery(meta_model(config), params):
        return method.finds
    return None
