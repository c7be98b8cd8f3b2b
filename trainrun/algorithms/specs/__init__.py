"""Every fact about a speed-up method that a run needs before torch is imported, one module each.

``specs/<name>.py`` holds the method's hyperparameter dataclass and its :class:`MethodSpec`: where
it runs among the others and why, what it needs of the run's task, data and model (a
:class:`~trainrun.kinds.Capability` they offer), what it cannot combine with, what the
data path must allow, whether it changes the step's cost along the run, and its own config check.
``trainrun/algorithms/<name>.py`` implements it and ``conf/algorithms/<name>.yaml`` selects it:
adding a method touches those three files. Validation, the engine's order, ``-o1``, ``recipe=auto``
and the docs read :data:`SPECS`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainrun import kinds
from trainrun.errors import ConfigError
from trainrun.kinds import Capability


@dataclass(frozen=True)
class MethodSpec:
    """What trainrun knows about one method without running it."""

    name: str  # the module, the YAML option and the key under ``algorithms``
    config: type  # the hyperparameter dataclass
    position: int  # the engine runs methods in ascending position (reversed on closing events)
    order_reason: str  # why it runs there, shown in docs/algorithms.md
    needs: frozenset[Capability] = frozenset()  # what the run's task, data and model must offer
    incompatible: Mapping[str, str] = field(default_factory=dict)  # other method -> why not together
    torch_loader_only: bool = False  # a per-sample transform that FFCV's pipeline cannot run
    varying_step_cost: bool = False  # the step's cost changes along the run: a profiled prefix misleads
    systems: bool = False  # changes how a step runs, not what it computes: -o1 may toggle it
    sequence_limit: str | None = None  # the config field bounding the sequence length the model accepts
    unsharded: str | None = None  # why it cannot run under parallel=fsdp (None: it can)
    check: Callable[[Any, Any], None] | None = None  # (its config, the run's TrainConfig) -> raise ConfigError

    def applies_to(self, offered: frozenset[Capability]) -> bool:
        """Whether a run that offers ``offered`` (:func:`trainrun.kinds.offers`) has what the method needs."""
        return self.needs <= offered


def discover_specs() -> dict[str, MethodSpec]:
    """Each ``SPEC`` under this package, in order of position."""
    found = [importlib.import_module(f"{__name__}.{module.name}").SPEC for module in pkgutil.iter_modules(__path__)]
    return {spec.name: spec for spec in sorted(found, key=lambda spec: spec.position)}


SPECS: dict[str, MethodSpec] = discover_specs()
METHOD_ORDER: tuple[str, ...] = tuple(SPECS)


def check_methods(config: Any) -> None:
    """The chosen methods apply to the run's task, combine with each other and with the data path,
    and pass their own checks; raise :class:`ConfigError` naming the first that does not."""
    chosen, task, offered = config.algorithms, config.task.name, kinds.offers(config)
    for name, params in chosen.items():
        spec = SPECS[name]
        if not spec.applies_to(offered):
            allowed = ", ".join(sorted(n for n, s in SPECS.items() if s.applies_to(offered)))
            tasks = kinds.tasks_offering(spec.needs)
            if task in tasks:  # the task has it: the data source or the model does not
                missing = "; ".join(need.value for need in spec.needs - offered)
                raise ConfigError(
                    f"algorithm '{name}' needs {missing}, which data={config.data.name} with "
                    f"model={config.model.name} does not offer; choose from: {allowed}"
                )
            raise ConfigError(
                f"algorithm '{name}' does not apply to task {task} (it is for {', '.join(tasks)}); "
                f"choose from: {allowed}"
            )
        for other, why in spec.incompatible.items():
            if other in chosen:
                first, second = sorted((name, other))
                raise ConfigError(f"algorithms '{first}' and '{second}' cannot run together: {why}")
        if spec.torch_loader_only and config.data.loader == "ffcv":
            raise ConfigError(
                f"algorithm '{name}' transforms images in the torch DataLoader, which data.loader=ffcv "
                f"does not use; choose a torch-loader data set (e.g. data=folder or data=digits)"
            )
        if spec.check is not None:
            spec.check(params, config)


def check_sequence_length(config: Any, positions: Callable[[Any], tuple[int, str] | None] | None) -> None:
    """A sequence model's windows (``data.text.max_seq_len``) within the longest sequence it takes:
    its own (``positions``, its kind spec's), or the bound a chosen method gives it instead (ALiBi's)."""
    if positions is None:
        return
    limit = sequence_limit(config.algorithms) or positions(config)
    if limit is not None and config.data.text.max_seq_len > limit[0]:
        raise ConfigError(
            f"bad value for 'data.text.max_seq_len': {config.data.text.max_seq_len} is more than the model's "
            f"{limit[0]} positions ({limit[1]})"
        )


def sequence_limit(algorithms: Mapping[str, Any]) -> tuple[int, str] | None:
    """(the longest sequence, the key that sets it) where a chosen method bounds it instead of the model."""
    for name, params in algorithms.items():
        if key := SPECS[name].sequence_limit:
            return getattr(params, key), f"algorithms.{name}.{key}"
    return None
