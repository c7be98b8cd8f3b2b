"""Every check of a composed config before any work starts: types and values (OmegaConf and the
fields' metadata), then what involves several fields, the chosen task's, data source's, model's
and methods' own checks (their specs) and, for a run, the files it reads. Raises
:class:`ConfigError` with one line naming the key. Nothing here names a task, model or data source."""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainrun import kinds
from trainrun.algorithms.specs import SPECS, check_methods, check_sequence_length
from trainrun.core.time import Time, TimeUnit
from trainrun.errors import ConfigError
from trainrun.kinds import Capability
from trainrun.loggers.mlflow_store import check_tracking_store
from trainrun.network import check_launcher
from trainrun.registry import names
from trainrun.schema import (
    FORMER_NAMES,
    INITIALIZERS,
    DataConfig,
    HardwareConfig,
    ModelConfig,
    TaskConfig,
    TrainConfig,
)


def validate(cfg: DictConfig, files: bool = True) -> TrainConfig:
    """Merge ``cfg`` into the schema and check every value (and, with ``files``, that the files a
    run reads exist); raise :class:`ConfigError` if bad."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
        for name, params in (merged.algorithms or {}).items():
            if name not in SPECS:
                raise ConfigError(f"unknown algorithm '{name}' (choose from: {', '.join(sorted(SPECS))})")
            typed = OmegaConf.merge(OmegaConf.structured(SPECS[name].config), params or {})
            merged.algorithms[name] = typed
        config: TrainConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(describe_omegaconf_error(error)) from error
    for former, name in FORMER_NAMES.items():  # a renamed key's value is read as the new key's
        if getattr(config, former) is not None:
            setattr(config, name, getattr(config, former))
            setattr(config, former, None)
    check_fields(config, "")
    for name, params in config.algorithms.items():
        check_fields(params, f"algorithms.{name}.")
    _check_run(config)
    if files:
        check_files(config)
    return config


def former_name_notices(cfg: DictConfig) -> list[str]:
    """One line for each renamed key ``cfg`` still sets (read as the new name)."""
    return [
        f"'{former}' is now '{name}'; read as {name} (rename it in your config)"
        for former, name in FORMER_NAMES.items()
        if OmegaConf.select(cfg, former) is not None
    ]


def moved_keys() -> dict[str, str]:
    """Each key that moved under its kind's section and where it is now (``model.bert.hidden_size``)."""
    moved: dict[str, str] = {}
    for group, section in (("model", ModelConfig), ("data", DataConfig)):
        for kind, hint in typing.get_type_hints(section).items():
            if dataclasses.is_dataclass(hint):  # the first kind with a name keeps it: the one it moved from
                for spec in dataclasses.fields(hint):
                    moved.setdefault(f"{group}.{spec.name}", f"{group}.{kind}.{spec.name}")
    return moved


def unknown_key_message(key: str) -> str:
    """The line for a key the schema does not have, naming where it went if it moved."""
    moved = moved_keys().get(key)
    if moved:
        return f"unknown config key '{key}': it is now '{moved}' (the settings of one kind sit under its name)"
    group, _, rest = key.partition(".")
    method = rest.split(".")[0]
    if group == "algorithms" and method in SPECS:
        return (
            f"unknown config key '{key}': '{method}' is not among this run's algorithms; list it there too, "
            f"e.g. algorithms=[{method}] (the list names every method of the run)"
        )
    return f"unknown config key '{key}'"


def describe_omegaconf_error(error: OmegaConfBaseException) -> str:
    """One line naming the key OmegaConf refused and why."""
    key = getattr(error, "full_key", None) or getattr(error, "key", None)
    message = str(error).splitlines()[0]
    if "not in struct" in message or "Key '" in message and "not" in message:
        return unknown_key_message(str(key))
    if key:
        return f"bad value for '{key}': {message}"
    return message


BOUNDS = {  # a field's metadata bound -> its sign, and whether a number keeps it
    "exclusive_min": (">", operator.gt),
    "min": (">=", operator.ge),
    "max": ("<=", operator.le),
    "exclusive_max": ("<", operator.lt),
}


# the optimizer fields only some optimizers read, by optimizer (every one reads the others: lr,
# weight_decay, exclude_norm_and_bias, lr_scaling, reference_batch_size; optimizer.muon.* is a section:
# SELECTORS); a run that sets one its optimizer does not read is refused. tests/test_optim.py checks
# it against what each builder reads.
OPTIMIZER_READS = {
    "sgdw": ("momentum", "dampening", "nesterov"),
    "sgd": ("momentum", "dampening", "nesterov"),
    "adamw": ("betas", "eps"),
    "lamb": ("betas", "eps", "max_grad_norm"),
    "radam": ("betas", "eps"),
    "muon": ("momentum", "nesterov", "betas", "eps"),
}
# sections named after a choice of their parent's selector, read only under that choice: model.<name>.*
# under model=<name> (model.bert.* under model=bert_base), optimizer.muon.* under optimizer=muon,
# data.ffcv.* under data.loader=ffcv. The rule reads the schema: it names no kind.
SELECTORS = {"model": "name", "optimizer": "name", "data": "loader"}


def refuse_unread_keys(keys: list[str], composed: DictConfig, options: dict[str, str]) -> None:
    """A key among ``keys`` (a run's overrides) that the kinds ``composed`` chose do not read would do
    nothing: refused in one line naming the key and the choice that leaves it unread (``options``:
    the user's ``data=``/``model=``/``optimizer=`` option names, where given)."""
    chosen = {parent: str(OmegaConf.select(composed, f"{parent}.{selector}")) for parent, selector in SELECTORS.items()}
    for key in keys:
        parent, _, rest = key.partition(".")
        if parent not in SELECTORS:
            continue
        line = _unread_section_key(key, parent, rest, chosen, options)
        if parent == "data":
            line = line or _unread_data_key(key, rest, str(OmegaConf.select(composed, "data.name")), options)
        if parent == "optimizer":
            line = line or _unread_optimizer_field(key, rest.split(".")[0], chosen["optimizer"], options)
        if line:
            raise ConfigError(line)


@functools.cache
def _section(parent: str) -> Any:
    """TrainConfig's section ``parent`` (``model``, ``data``) at its defaults: its fields and sections."""
    return getattr(TrainConfig(), parent)


def _section_fields(parent: str) -> dict[str, dataclasses.Field]:
    return {field.name: field for field in dataclasses.fields(_section(parent))}


def _unread_data_key(key: str, rest: str, name: str, options: dict[str, str]) -> str | None:
    """The line for ``data.<rest>``, a source key (:data:`~trainrun.kinds.DATA_SOURCE_KEYS`) that data
    kind ``name`` does not read (:attr:`~trainrun.kinds.KindSpec.reads`); None if it reads it."""
    spec = kinds.specs("data").get(name)  # an unknown kind: validation names the choices
    if spec is None or rest.split(".")[0] not in kinds.DATA_SOURCE_KEYS or spec.reads_key(rest):
        return None
    sections = {read for read in kinds.DATA_SOURCE_KEYS if dataclasses.is_dataclass(getattr(_section("data"), read))}
    named = [f"data.{read}" + (".*" if read in sections else "") for read in spec.reads or kinds.DATA_SOURCE_KEYS]
    reads = f"it reads {', '.join(named)}" if spec.reads else f"it reads none of {', '.join(named)}"
    return f"bad key '{key}': data={options.get('data', name)} does not read it ({reads})"


def _unread_section_key(
    key: str, parent: str, rest: str, chosen: dict[str, str], options: dict[str, str]
) -> str | None:
    """The line for a key of another choice's section (:data:`SELECTORS`); None otherwise."""
    if "." not in rest:
        return None
    section, selector = rest.split(".")[0], SELECTORS[parent]
    fields = _section_fields(parent)
    choices = fields[selector].metadata.get("choices", ())
    if section not in fields or section not in choices or section == chosen[parent]:
        return None
    label = parent if selector == "name" else f"{parent}.{selector}"  # model=, data.loader=
    shown = options.get(parent, chosen[parent]) if selector == "name" else chosen[parent]
    return f"bad key '{key}': {label}={shown} does not read it ({parent}.{section}.* is read under {label}={section})"


def _unread_optimizer_field(key: str, field: str, optimizer: str, options: dict[str, str]) -> str | None:
    """The line for an optimizer field only other optimizers read (:data:`OPTIMIZER_READS`)."""
    readers = [name for name, read in OPTIMIZER_READS.items() if field in read]
    if not readers or optimizer in readers:
        return None
    shown = options.get("optimizer", optimizer)
    return f"bad key '{key}': optimizer={shown} does not read it (read by optimizer={', '.join(readers)})"


def check_fields(obj: Any, prefix: str) -> None:
    """Each field of the dataclass ``obj`` within what its metadata allows (:mod:`trainrun.fields`)."""
    for spec in dataclasses.fields(obj):
        value = getattr(obj, spec.name)
        key = prefix + spec.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
            continue
        if isinstance(value, list) and value and all(dataclasses.is_dataclass(item) for item in value):
            for index, item in enumerate(value):  # a list of sections (data.mix): keys as Hydra names them
                check_fields(item, f"{key}.{index}.")
            continue
        if value is None:
            continue
        meta = spec.metadata
        if meta.get("time"):
            for time in value if isinstance(value, list) else [value]:
                _check_time(key, time, meta)
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"bad value for '{key}': '{value}' (choose from: {', '.join(meta['choices'])})")
        if "length" in meta and len(value) != meta["length"] and not (meta.get("optional") and value == []):
            raise ConfigError(f"bad value for '{key}': {value} (give {meta['length']} numbers)")
        numbers, each = (value, "each ") if isinstance(value, list) else ([value], "")
        for bound, (sign, holds) in BOUNDS.items():
            if bound in meta and not all(holds(number, meta[bound]) for number in numbers):
                raise ConfigError(f"bad value for '{key}': {value} ({each}must be {sign} {meta[bound]})")


def _check_time(key: str, value: str, meta: dict) -> None:
    try:
        parsed = Time.parse(value)
    except ValueError as error:
        raise ConfigError(f"bad value for '{key}': {error}") from None
    if meta.get("interval") and parsed.value <= 0:
        raise ConfigError(f"bad value for '{key}': '{value}' is an interval of zero, which never fires")
    if parsed.unit.is_budget and not meta.get("budget"):
        raise ConfigError(
            f"bad value for '{key}': '{value}' is a budget; only max_duration takes one "
            "(write times inside a run in ep, ba, sp or dur)"
        )


def check_files(config: TrainConfig) -> None:
    """The files and folders a run reads exist: checked before a run, not to print a config. The
    chosen task, data source and model check their own (:attr:`trainrun.kinds.KindSpec.check_files`)."""
    for spec in kinds.chosen(config).values():
        if spec.check_files is not None:
            spec.check_files(config)
    data = config.data
    weights = config.model.weights
    if weights and not Path(weights).expanduser().exists():
        raise ConfigError(f"bad value for 'model.weights': '{weights}' does not exist")
    if data.path and not Path(data.path).expanduser().is_dir():
        raise ConfigError(f"bad value for 'data.path': '{data.path}' is not a directory")
    if config.resume not in (None, "auto") and not Path(config.resume).expanduser().exists():
        raise ConfigError(f"bad value for 'resume': checkpoint '{config.resume}' does not exist")
    uri = config.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if "mlflow" in config.loggers and uri and (why := check_tracking_store(uri)):
        raise ConfigError(f"bad value for 'mlflow.tracking_uri': '{uri}': {why}")


def _check_budget(config: TrainConfig) -> None:
    """A wall-clock or cost ``max_duration`` is positive, priced, and only ``max_duration``."""
    budget = Time.parse(config.max_duration)
    if budget.value <= 0:
        raise ConfigError(f"bad value for 'max_duration': '{config.max_duration}' (a budget must be above zero)")
    if budget.unit is TimeUnit.DOLLAR and not config.hardware.price_per_hour:
        raise ConfigError(
            f"max_duration={config.max_duration} needs a price: choose a priced hardware option "
            f"(hardware={config.hardware.name} has none), e.g. hardware=1xa100_aws"
        )
    if config.profile_prefix is not None:
        raise ConfigError("'profile_prefix' extrapolates a run of fixed length: it needs max_duration in ep, ba or sp")


def _check_nesterov(config: TrainConfig) -> None:
    """Nesterov momentum, as torch's SGD takes it, needs a momentum and no dampening (else the run
    would fail at its first step, exit 1)."""
    optimizer = config.optimizer
    if optimizer.name in ("sgd", "sgdw") and optimizer.nesterov and (optimizer.momentum <= 0 or optimizer.dampening):
        raise ConfigError(
            f"bad value for 'optimizer.nesterov': true needs optimizer.momentum above 0 and optimizer.dampening 0 "
            f"(momentum {optimizer.momentum:g}, dampening {optimizer.dampening:g}): set optimizer.nesterov=false"
        )


def _check_hardware(hardware: HardwareConfig) -> None:
    """``hardware.architecture`` is a GPU generation trainrun knows (trainrun/estimate/generations.yaml)."""
    from trainrun.estimate.device import known_architectures

    known = known_architectures()
    if hardware.architecture is not None and hardware.architecture not in known:
        raise ConfigError(
            f"bad value for 'hardware.architecture': '{hardware.architecture}' (choose from: {', '.join(known)})"
        )


def _check_run(config: TrainConfig) -> None:
    """Checks that involve more than one field."""
    duration = Time.parse(config.max_duration)
    if duration.unit is TimeUnit.DURATION:
        raise ConfigError(f"bad value for 'max_duration': '{config.max_duration}' (dur is relative to it)")
    if duration.unit.is_budget:
        _check_budget(config)
    elif duration.value <= 0:
        raise ConfigError(f"bad value for 'max_duration': '{config.max_duration}' (a run must be longer than zero)")
    for name in config.model.initializers:
        if name not in INITIALIZERS:
            raise ConfigError(f"bad value for 'model.initializers': '{name}' (choose from: {', '.join(INITIALIZERS)})")
    _check_kinds(config)  # before the methods: a brought model's checks say why it does not build
    check_methods(config)
    check_launcher(config.launcher)
    if config.launcher.devices != "auto":
        ranks = int(config.launcher.devices) * config.launcher.nnodes
        check_batch_split(config.train_batch_size, config.eval_batch_size, ranks)
        check_microbatch_size(config.device_train_microbatch_size, config.train_batch_size, ranks)
    else:
        check_microbatch_size(config.device_train_microbatch_size, config.train_batch_size, None)
    if config.profile_prefix is not None and Time.parse(config.profile_prefix).value <= 0:
        raise ConfigError(f"bad value for 'profile_prefix': '{config.profile_prefix}' (must be above 0)")
    for name in config.loggers:
        if name not in names("logger"):
            raise ConfigError(f"bad value for 'loggers': '{name}' (choose from: {', '.join(names('logger'))})")
    _check_quality_values(config)
    _check_hardware(config.hardware)
    _check_nesterov(config)
    _check_parallel(config)
    if config.optimizer.name == "muon" and Capability.HIDDEN_MATRICES not in kinds.offers(config):
        models = kinds.specs("model").values()
        matrices = " or ".join(f"model={spec.name}" for spec in models if Capability.HIDDEN_MATRICES in spec.offers)
        raise ConfigError(
            f"bad value for 'optimizer.name': 'muon' takes 2-D matrices; model '{config.model.name}' has "
            f"convolutions (use it with {matrices})"
        )


def _check_parallel(config: TrainConfig) -> None:
    """Sharding and activation checkpointing where the model and the methods allow them."""
    settings, offered = config.parallel, kinds.offers(config)
    if settings.activation_checkpointing != "none" and Capability.TRANSFORMER_BLOCKS not in offered:
        blocks = " or ".join(
            spec.name for spec in kinds.specs("model").values() if Capability.TRANSFORMER_BLOCKS in spec.offers
        )
        raise ConfigError(
            f"bad value for 'parallel.activation_checkpointing': '{settings.activation_checkpointing}' recomputes "
            f"blocks, which model '{config.model.name}' has not (use it with model={blocks})"
        )
    if settings.name != "fsdp":
        return
    if config.precision == "amp":
        raise ConfigError(
            "bad value for 'precision': 'amp' (fp16 with loss scaling) does not run under parallel=fsdp; "
            "use precision=bf16 (bfloat16 compute, float32 master weights and gradient reduction)"
        )
    if config.optimizer.name == "muon":
        raise ConfigError(
            "bad value for 'optimizer.name': 'muon' does not run under parallel=fsdp (it orthogonalises whole "
            "matrices, and its state lives in two inner optimizers a sharded checkpoint does not read); use "
            "parallel=ddp, or optimizer=adamw under fsdp"
        )
    for name in config.algorithms:
        if SPECS[name].unsharded:
            raise ConfigError(f"algorithm '{name}' does not run under parallel=fsdp: {SPECS[name].unsharded}")


class KindMismatch(ConfigError):
    """A task, data source or model that does not speak the batches of the kind the user chose
    first (``anchor``): the registered names of both, the names that would do and their ``conf/`` options."""

    def __init__(self, kind: str, name: str, anchor: str, anchor_name: str, allowed: list[str], options: list[str]):
        self.kind, self.name, self.anchor, self.anchor_name = kind, name, anchor, anchor_name
        self.allowed, self.options = allowed, options
        super().__init__(self.naming({}))

    def naming(self, choices: dict[str, str]) -> str:
        """The refusal in the words of the ``conf/`` options the user chose (``data=stdlib_docs``), where
        an option is a preset of another registered name (``text``)."""
        option = choices.get(self.kind, self.name)
        key = f"'{self.kind}.name': '{self.name}' (" if option == self.name else (
            f"'{self.kind}': '{option}' ({self.kind}.name '{self.name}'; "
        )  # fmt: skip
        anchor = f"{self.anchor}={choices.get(self.anchor, self.anchor_name)}"
        choose = f"; choose {' or '.join(self.options)}" if self.options else ""
        return f"bad value for {key}with {anchor} it must be {' or '.join(self.allowed)}){choose}"


def _check_kinds(config: TrainConfig) -> None:
    """The task, data source and model speak the same batches (the first of them the user changed
    from the schema's default is the one the others must suit), then each passes its own checks."""
    parts = kinds.chosen(config)
    defaults = {"task": TaskConfig().name, "data": DataConfig().name, "model": ModelConfig().name}
    anchor = next((kind for kind, spec in parts.items() if spec.name != defaults[kind]), "task")
    batches = parts[anchor].batches
    for kind, spec in parts.items():
        if not spec.speaks(batches):
            names = kinds.serving(kind, batches)
            chooses = kinds.option_names(kind, defaults[kind])  # conf/<kind>/ option: the name it chooses
            options = [f"{kind}={option}" for name in names for option, chosen in chooses.items() if chosen == name]
            raise KindMismatch(kind, spec.name, anchor, parts[anchor].name, names, options)
    task = kinds.task_spec(config.task.name)
    if config.loss not in task.losses:
        raise ConfigError(f"bad value for 'loss': '{config.loss}' (task {task.name} trains with {task.trains_with})")
    for spec in parts.values():
        if spec.check is not None:
            spec.check(config)
    check_sequence_length(config, parts["model"].positions)


def _check_quality_values(config: TrainConfig) -> None:
    """``stop_at`` and ``quality_targets`` are values the task's quality can take: fractions in
    (0, 1] for an accuracy, positive numbers for a loss."""
    rule = kinds.task_spec(config.task.name).quality
    kind = "a fraction in (0, 1]" if rule.percent else f"a positive {rule.label}"
    for key, values in (
        ("stop_at", [] if config.stop_at is None else [config.stop_at]),
        ("quality_targets", config.quality_targets),
    ):
        for value in values:
            if not 0 < value <= (1 if rule.percent else float("inf")):
                raise ConfigError(f"bad value for '{key}': {value:g} ({kind} of the quality metric, {rule.metric})")


def check_batch_split(train_batch_size: int, eval_batch_size: int, ranks: int) -> None:
    """The global batch sizes divide evenly among ``ranks`` processes."""
    for key, size in (("train_batch_size", train_batch_size), ("eval_batch_size", eval_batch_size)):
        if size % ranks:
            raise ConfigError(
                f"bad value for '{key}': {size} does not divide among {ranks} processes "
                f"({size // ranks} or {size // ranks + 1} per process; choose a multiple of {ranks})"
            )


def check_microbatch_size(setting: str | None, train_batch_size: int, ranks: int | None) -> None:
    """``device_train_microbatch_size`` is ``auto`` or a positive number no larger than each
    process's share of the batch (checked when the number of processes is known)."""
    if setting is None or setting == "auto":
        return
    if not setting.isdigit() or int(setting) == 0:
        raise ConfigError(f"bad value for 'device_train_microbatch_size': '{setting}' (auto or a positive number)")
    if ranks is not None and int(setting) > train_batch_size // ranks:
        raise ConfigError(
            f"bad value for 'device_train_microbatch_size': {setting} is more than each process's batch of "
            f"{train_batch_size // ranks} (train_batch_size {train_batch_size} over {ranks} process(es))"
        )
