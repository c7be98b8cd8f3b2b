"""From argv to a validated config: Composer-style flags to Hydra overrides, composition, checks.

Imported by the CLI, the sweep and the report (which re-composes recipes); it imports neither
torch nor the trainer, so a bad key, value or path fails at once with one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from trainrun.errors import ConfigError
from trainrun.schema import ALGORITHM_CONFIGS, TrainConfig, describe_omegaconf_error, list_keys, validate

HYDRA_FLAGS = {"-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "--resolve", "-r", "--run"}
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--experimental-rerun"}
PRINT_FLAGS = {"--cfg", "-c"}  # print the composed config, run nothing
NO_RUN_FLAGS = {"-h", "--help", "--hydra-help", "--version", "--info", "-i", "--shell-completion", "-sc"}


def config_dir() -> Path:
    """``conf/`` inside the installed package, or beside the package in a source checkout."""
    installed = Path(__file__).resolve().parent / "conf"
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / "conf"


def _is_value(token: str) -> bool:
    if token.startswith("-"):
        return token[1:2].isdigit() or token[1:2] == "."
    return "=" not in token


def translate(argv: list[str]) -> tuple[list[str], list[str], bool]:
    """Split argv into (Hydra flags, overrides, debug), turning ``--key value...`` into overrides."""
    hydra_args, overrides, debug = [], [], False
    lists = list_keys()
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--debug":
            debug = True
        elif token in HYDRA_FLAGS or token.split("=")[0] in {"--shell-completion", "-sc"}:
            hydra_args.append(token)
        elif token in HYDRA_FLAGS_WITH_VALUE:
            optional = token in {"--info", "-i"}
            if index < len(argv) and (not optional or _is_value(argv[index])):
                hydra_args += [token, argv[index]]
                index += 1
            elif optional:
                hydra_args.append(token)
            else:
                raise ConfigError(f"flag '{token}' needs a value")
        elif token.startswith("--"):
            key, has_value, value = token[2:].partition("=")
            values = [value] if has_value else []
            while not has_value and index < len(argv) and _is_value(argv[index]):
                values.append(argv[index])
                index += 1
            if not key:
                raise ConfigError(f"cannot read flag '{token}'")
            if key in lists or len(values) > 1:
                overrides.append(f"{key}=[{','.join(values)}]")
            else:
                overrides.append(f"{key}={values[0] if values else 'true'}")
        elif token.startswith("-"):
            raise ConfigError(f"unknown flag '{token}' (Hydra flags: -m, --cfg job, --help; options: --KEY VALUE)")
        else:
            overrides.append(token)
    return hydra_args, overrides, debug


def register_schema() -> None:
    """Register the schema with Hydra: ``trainrun_schema`` (the whole run, the base of
    ``conf/config.yaml``) and ``schema/algorithms/<name>`` (each algorithm's values, the base of
    ``conf/algorithms/<name>.yaml``). The schema is the one place every default is written."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="trainrun_schema", node=TrainConfig)
    for name, config in ALGORITHM_CONFIGS.items():
        store.store(group="schema/algorithms", name=name, node={name: config})


def _sweep_jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists of every job a (multi)run will launch."""
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (file names under conf/<group>/)."""
    return sorted(path.stem for path in (config_dir() / group).glob("*.yaml"))


def _composition_message(error: Exception) -> str:
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return f"unknown option '{option}' for '{group}' (choose from: {', '.join(group_options(group))})"
    if isinstance(error, OverrideParseException):
        detail = [line for line in str(error).splitlines() if line and not line.startswith(("Error", "See "))]
        return f"cannot parse override '{error.override.lstrip('+')}'" + (f": {detail[0]}" if detail else "")
    cause = error.__cause__
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if cause is not None:  # a key or value the schema refuses, found while composing
        return describe_omegaconf_error(cause)
    text = " ".join(str(error).split())
    if "not in struct" in text or "To append to your config use" in text:
        key = text.split("'")[1] if "'" in text else text
        return f"unknown config key '{key}'"
    return str(error).strip().splitlines()[0]


def compose(overrides: list[str]) -> DictConfig:
    """The config Hydra composes for ``overrides``; composition errors become :class:`ConfigError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_schema()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except Exception as error:  # hydra raises several types; all mean a bad override
        raise ConfigError(_composition_message(error)) from error


def check(overrides: list[str], multirun: bool = False, files: bool = True) -> list[TrainConfig]:
    """Compose and validate every job of a (multi)run; the first bad one raises. ``files=False``
    leaves out whether the data and checkpoint files exist (printing a config needs none)."""
    try:
        jobs = _sweep_jobs(overrides, multirun)
    except Exception as error:
        raise ConfigError(" ".join(str(error).split())) from error
    for job in jobs:
        _refuse_repeated_algorithms(job)
    return [validate(compose(job), files) for job in jobs]


def _refuse_repeated_algorithms(overrides: list[str]) -> None:
    """``algorithms=[ema,ema]`` would compose to one EMA without a word: say so instead."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return  # composing reports it, naming the override as typed
    for override in parsed:
        names = override.value() if override.key_or_group == "algorithms" else None
        if isinstance(names, list) and (repeated := sorted({name for name in names if names.count(name) > 1})):
            raise ConfigError(f"bad value for 'algorithms': '{repeated[0]}' is listed twice")
