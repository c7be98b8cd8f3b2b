"""A run's ``algorithms=[...]`` checked against what Hydra composes from it, before anything starts.

Hydra reads a list given for a group as the whole list (a recipe's methods are replaced, not added
to) and composes a method twice named as one; a recipe's body that sets a method's values brings it
back whatever the list says. Each of these would change the run's methods without a word, so each
is refused in one line naming what the run would get.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

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
