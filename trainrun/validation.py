"""Every check of a composed config before any work starts: types and values (OmegaConf and the
fields' metadata), then what involves several fields, the chosen methods' own checks and, for a
run, the files it reads. Raises :class:`ConfigError` with one line naming the key."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainrun.algorithms.specs import SPECS, check_methods, sequence_limit
from trainrun.core.time import Time, TimeUnit
from trainrun.errors import ConfigError
from trainrun.quality import QUALITY_OF_TASK
from trainrun.registry import names
from trainrun.schema import INITIALIZERS, LauncherConfig, TrainConfig, moved_keys


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
    check_fields(config, "")
    for name, params in config.algorithms.items():
        check_fields(params, f"algorithms.{name}.")
    _check_run(config)
    if files:
        check_files(config)
    return config


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


def check_fields(obj: Any, prefix: str) -> None:
    """Each field of the dataclass ``obj`` within what its metadata allows (:mod:`trainrun.fields`)."""
    for spec in dataclasses.fields(obj):
        value = getattr(obj, spec.name)
        key = prefix + spec.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
            continue
        if value is None:
            continue
        meta = spec.metadata
        if meta.get("time"):
            for time in value if isinstance(value, list) else [value]:
                _check_time(key, time, meta)
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"bad value for '{key}': '{value}' (choose from: {', '.join(meta['choices'])})")
        if "exclusive_min" in meta and not value > meta["exclusive_min"]:
            raise ConfigError(f"bad value for '{key}': {value} (must be > {meta['exclusive_min']})")
        if "min" in meta and not value >= meta["min"]:
            raise ConfigError(f"bad value for '{key}': {value} (must be >= {meta['min']})")
        if "max" in meta and not value <= meta["max"]:
            raise ConfigError(f"bad value for '{key}': {value} (must be <= {meta['max']})")


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
    """The files and folders a run reads exist: checked before a run, not to print a config."""
    data = config.data
    if data.name in ("text", "token_stream") and not data.path and not data.text.corpus:
        raise ConfigError(f"data={data.name} needs 'data.path' (a token store written by 'trainrun write-text')")
    if data.name == "decathlon" and not (data.path and (Path(data.path).expanduser() / "dataset.json").is_file()):
        raise ConfigError(
            f"data=decathlon needs 'data.path': a Decathlon task folder with dataset.json (got '{data.path}')"
        )
    if data.name == "folder" and not data.path:
        raise ConfigError("data=folder needs 'data.path' (a directory with train/ and val/ subfolders)")
    weights = config.model.weights
    if weights and not Path(weights).expanduser().exists():
        raise ConfigError(f"bad value for 'model.weights': '{weights}' does not exist")
    if data.path and not Path(data.path).expanduser().is_dir():
        raise ConfigError(f"bad value for 'data.path': '{data.path}' is not a directory")
    if data.path and config.task.name == "masked_lm":  # a byte-level BPE store has no [MASK]
        from trainrun.data.token_store import SPECIAL_TOKENS, TokenStore

        store = TokenStore.open(Path(data.path), "train")
        store.check_special_tokens(SPECIAL_TOKENS, "masked language modelling")
    if data.name == "beton":
        for key in ("train", "val"):
            path = getattr(data, key)
            if not path:
                raise ConfigError(f"data=beton needs 'data.{key}' (a .beton file written by 'trainrun write')")
            if not Path(path).expanduser().is_file():
                raise ConfigError(f"bad value for 'data.{key}': '{path}' does not exist")
    if config.resume not in (None, "auto") and not Path(config.resume).expanduser().is_file():
        raise ConfigError(f"bad value for 'resume': checkpoint '{config.resume}' does not exist")


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
    check_methods(config)
    _check_launcher(config.launcher)
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
    if config.data.name == "beton" and config.data.loader != "ffcv":
        raise ConfigError("data=beton reads .beton files: it needs data.loader=ffcv")
    if config.data.name == "folder" and config.data.loader == "ffcv":
        raise ConfigError(
            "data=folder reads image files with the torch loader; for FFCV write them once with "
            "'trainrun write' and use data=beton"
        )
    if len(config.data.mean) != 3 or len(config.data.std) != 3:
        raise ConfigError("bad value for 'data.mean'/'data.std': give three values (R, G, B)")
    if config.task.name == "masked_lm" or config.data.name == "text" or config.model.name == "bert":
        _check_masked_lm(config)
        return
    if config.task.name == "causal_lm" or config.data.name == "token_stream" or config.model.name == "gpt":
        _check_causal_lm(config)
        return
    if config.task.name == "segmentation" or config.data.name in SEGMENTATION_DATA or config.model.name == "unet":
        _check_segmentation(config)
        return
    if config.optimizer.name == "muon":
        raise ConfigError(
            f"bad value for 'optimizer.name': 'muon' takes 2-D matrices; model '{config.model.name}' has "
            "convolutions (use it with model=gpt or model=bert)"
        )
    if config.model.num_classes != config.data.num_classes:
        raise ConfigError(
            f"bad value for 'model.num_classes': {config.model.num_classes} but data "
            f"'{config.data.name}' has {config.data.num_classes} classes"
        )


def _check_quality_values(config: TrainConfig) -> None:
    """``stop_at`` and ``accuracy_targets`` are values the task's quality can take: fractions in
    (0, 1] for an accuracy, positive numbers for a loss."""
    rule = QUALITY_OF_TASK[config.task.name]
    kind = "a fraction in (0, 1]" if rule.percent else f"a positive {rule.label}"
    for key, values in (
        ("stop_at", [] if config.stop_at is None else [config.stop_at]),
        ("accuracy_targets", config.accuracy_targets),
    ):
        for value in values:
            if not 0 < value <= (1 if rule.percent else float("inf")):
                raise ConfigError(f"bad value for '{key}': {value:g} ({kind} of the quality metric, {rule.metric})")


def _check_language_run(config: TrainConfig, task: str, data: str, model: str) -> None:
    """A language task's data and model chosen together, trained with cross-entropy from the torch loader."""
    parts = {"task": (config.task.name, task), "data": (config.data.name, data), "model": (config.model.name, model)}
    for key, (chosen, needed) in parts.items():
        if chosen != needed:
            others = ", ".join(f"{k}={v}" for k, (c, v) in parts.items() if c == v)
            raise ConfigError(f"bad value for '{key}.name': '{chosen}' (with {others} it must be {needed})")
    if config.loss != "soft_ce":
        raise ConfigError(f"bad value for 'loss': '{config.loss}' (task {task} trains with cross-entropy, soft_ce)")
    if config.data.loader != "torch":
        raise ConfigError("bad value for 'data.loader': text is read with the torch loader (data.loader=torch)")


def _check_causal_lm(config: TrainConfig) -> None:
    """A causal language run: a token stream, a GPT and the causal-LM task together."""
    _check_language_run(config, "causal_lm", "token_stream", "gpt")
    gpt = config.model.gpt
    if gpt.width % gpt.heads or (gpt.width // gpt.heads) % 2:
        raise ConfigError(
            f"bad value for 'model.gpt.heads': {gpt.heads} heads do not split model.gpt.width {gpt.width} "
            "into heads of an even size"
        )
    if 2 * gpt.value_embeddings > gpt.layers:
        raise ConfigError(
            f"bad value for 'model.gpt.value_embeddings': {gpt.value_embeddings} tables serve the first and the "
            f"last {gpt.value_embeddings} blocks, more than model.gpt.layers {gpt.layers}"
        )
    limit = sequence_limit(config.algorithms) or (
        None if gpt.positions == "alibi" else (gpt.max_seq_len, "model.gpt.max_seq_len")
    )
    if limit is not None and config.data.text.max_seq_len > limit[0]:
        raise ConfigError(
            f"bad value for 'data.text.max_seq_len': {config.data.text.max_seq_len} is more than the model's "
            f"{limit[1]} {limit[0]}"
        )


SEGMENTATION_DATA = ("synthetic_brats", "decathlon")


def _check_segmentation(config: TrainConfig) -> None:
    """A segmentation run: volume data, a UNet and the segmentation task together, with patches
    the network's levels divide."""
    parts = {
        "task.name": (config.task.name, ("segmentation",)),
        "data.name": (config.data.name, SEGMENTATION_DATA),
        "model.name": (config.model.name, ("unet",)),
    }
    for key, (chosen, allowed) in parts.items():
        if chosen not in allowed:
            raise ConfigError(f"bad value for '{key}': '{chosen}' (a segmentation run needs {' or '.join(allowed)})")
    if config.loss != "soft_ce":
        raise ConfigError(f"bad value for 'loss': '{config.loss}' (task segmentation trains with Dice + cross-entropy)")
    if config.data.loader != "torch":
        raise ConfigError("bad value for 'data.loader': volumes are read with the torch loader (data.loader=torch)")
    if config.optimizer.name == "muon":
        raise ConfigError("bad value for 'optimizer.name': 'muon' takes 2-D matrices; a UNet has convolutions")
    unet, segmentation = config.model.unet, config.data.segmentation
    if len(unet.filters) != len(unet.strides) or len(unet.strides) < 3:
        raise ConfigError(
            f"bad value for 'model.unet.filters': {len(unet.filters)} levels but model.unet.strides has "
            f"{len(unet.strides)} (one of each per level, at least 3)"
        )
    patch, divisor = list(segmentation.patch_size), math.prod(unet.strides)
    if len(patch) != unet.dimensions or any(side <= 0 or side % divisor for side in patch):
        raise ConfigError(
            f"bad value for 'data.segmentation.patch_size': {patch} (model.unet.dimensions {unet.dimensions} sides, "
            f"each a multiple of {divisor}, the product of model.unet.strides)"
        )
    if unet.norm == "instance" and all(side == divisor for side in patch):
        raise ConfigError(
            f"bad value for 'data.segmentation.patch_size': {patch} leaves one voxel at the deepest level, which "
            f"instance norm cannot normalise; make a side at least {2 * divisor}"
        )
    if segmentation.fold >= segmentation.folds:
        raise ConfigError(
            f"bad value for 'data.segmentation.fold': {segmentation.fold} (folds are 0 to {segmentation.folds - 1})"
        )
    if config.data.name == "synthetic_brats":
        if segmentation.synthetic_cases < segmentation.folds:
            raise ConfigError(
                f"bad value for 'data.segmentation.synthetic_cases': {segmentation.synthetic_cases} "
                f"(at least data.segmentation.folds, {segmentation.folds}: each fold holds out at least one case)"
            )
        if len(segmentation.synthetic_shape) != 3 or min(segmentation.synthetic_shape) < 2:
            raise ConfigError(
                f"bad value for 'data.segmentation.synthetic_shape': {list(segmentation.synthetic_shape)} "
                "(depth, height, width, each at least 2)"
            )
        if unet.in_channels != 4 or config.data.num_classes != 4:
            raise ConfigError(
                "bad value for 'model.unet.in_channels': synthetic_brats has 4 channels and 4 labels "
                f"(got in_channels {unet.in_channels}, data.num_classes {config.data.num_classes})"
            )
    _check_segmentation_outputs(config)


def _check_segmentation_outputs(config: TrainConfig) -> None:
    """Regions name foreground labels, and the model has one output per class or region."""
    regions = [list(region) for region in config.data.segmentation.regions]
    labels = range(1, config.data.num_classes)
    for region in regions:
        if not region or any(label not in labels for label in region):
            raise ConfigError(
                f"bad value for 'data.segmentation.regions': {regions} (each region a non-empty list of the "
                f"foreground labels 1 to {config.data.num_classes - 1})"
            )
    outputs = len(regions) or config.data.num_classes
    if config.model.num_classes != outputs:
        what = f"{len(regions)} regions" if regions else f"{config.data.num_classes} classes"
        raise ConfigError(
            f"bad value for 'model.num_classes': {config.model.num_classes} but data '{config.data.name}' has {what} "
            "(one output each)"
        )


def _check_masked_lm(config: TrainConfig) -> None:
    """A language run: text data, a BERT and the masked-LM task together, and what they allow."""
    _check_language_run(config, "masked_lm", "text", "bert")
    if config.data.text.tokenizer == "bpe" and not config.data.path:
        raise ConfigError(
            "bad value for 'data.text.tokenizer': bpe has no [MASK] token for masked LM (task causal_lm); use wordpiece"
        )
    alibi = config.algorithms.get("alibi")
    if alibi is not None and alibi.train_sequence_length_scaling < 1:
        raise ConfigError(
            "bad value for 'algorithms.alibi.train_sequence_length_scaling': "
            f"{alibi.train_sequence_length_scaling} splits causal sequences only (task causal_lm); use 1.0"
        )
    positions, key = sequence_limit(config.algorithms) or (
        config.model.bert.max_position_embeddings,
        "model.bert.max_position_embeddings",
    )
    if config.data.text.max_seq_len > positions:
        raise ConfigError(
            f"bad value for 'data.text.max_seq_len': {config.data.text.max_seq_len} is more than the model's "
            f"{positions} positions ({key})"
        )
    bert = config.model.bert
    if bert.hidden_size % bert.heads:
        raise ConfigError(
            f"bad value for 'model.bert.heads': {bert.heads} does not divide model.bert.hidden_size {bert.hidden_size}"
        )


def _is_this_machine(host: str) -> bool:
    """Whether ``host`` names the local machine wherever it is read (loopback or unspecified)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


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


def _check_launcher(launcher: LauncherConfig) -> None:
    if launcher.devices != "auto" and not (launcher.devices.isdigit() and int(launcher.devices) > 0):
        raise ConfigError(f"bad value for 'launcher.devices': '{launcher.devices}' (auto or a positive number)")
    if launcher.node_rank >= launcher.nnodes:
        raise ConfigError(
            f"bad value for 'launcher.node_rank': {launcher.node_rank} (below launcher.nnodes {launcher.nnodes})"
        )
    if launcher.nnodes > 1 and launcher.master_port is None and not launcher.rdzv_endpoint:
        raise ConfigError(
            "a multi-node launch needs 'launcher.master_port' (the same on every node) or 'launcher.rdzv_endpoint'"
        )
    if launcher.nnodes > 1 and not launcher.rdzv_endpoint and _is_this_machine(launcher.master_addr):
        raise ConfigError(
            f"bad value for 'launcher.master_addr': '{launcher.master_addr}' is this machine on every node; "
            "a multi-node launch needs the address of the node_rank 0 machine that every node can reach"
        )
