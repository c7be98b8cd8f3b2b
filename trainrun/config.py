"""From argv to a validated config: Composer-style flags to Hydra overrides, composition, checks.

Imported by the CLI, the sweep and the report (which re-composes recipes); it imports neither
torch nor the trainer, so a bad key, value or path fails at once with one line and exit code 2.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from trainrun import kinds, run_files
from trainrun.algorithms.specs import SPECS
from trainrun.atomic_io import read_yaml, yaml_error_message
from trainrun.command_line import LOCATION_FLAGS, opened
from trainrun.errors import ConfigError
from trainrun.fields import list_keys
from trainrun.kinds import config_dir
from trainrun.method_list import leave_out_inapplicable, refuse_dropped_methods, refuse_repeated_methods
from trainrun.schema import TrainConfig
from trainrun.validation import (
    KindMismatch,
    describe_omegaconf_error,
    former_name_notices,
    refuse_unread_keys,
    unknown_key_message,
    validate,
)

HYDRA_FLAGS = {"-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "--resolve", "-r", "--run"}
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--experimental-rerun"}
HYDRA_FLAGS_WITH_VALUE |= set(LOCATION_FLAGS) | set(LOCATION_FLAGS.values())
OPTIMIZE_FLAG = "-o1"  # trainrun's own: time the systems settings, train with the fastest (trainrun.choose)
AUTO_RECIPE = "recipe=auto"  # trainrun's own: choose the recipe for a budget (trainrun.choose)
PRINT_FLAGS = {"--cfg", "-c"}  # print the composed config, run nothing
NO_RUN_FLAGS = {"-h", "--help", "--hydra-help", "--version", "--info", "-i", "--shell-completion", "-sc"}


def _is_value(token: str) -> bool:
    return token[1:2].isdigit() or token[1:2] == "." if token.startswith("-") else "=" not in token


def translate(argv: list[str]) -> tuple[list[str], list[str], bool]:
    """Split argv into (Hydra flags, overrides, debug), turning ``--key value...`` into overrides."""
    hydra_args, overrides, debug = [], [], False
    lists = list_keys(TrainConfig) | {"algorithms"}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--debug":
            debug = True
        elif token == OPTIMIZE_FLAG:
            hydra_args.append(token)
        elif token in HYDRA_FLAGS or token.split("=")[0] in {"--shell-completion", "-sc"}:
            hydra_args.append(token)
        elif "=" in token and token.split("=")[0] in {*LOCATION_FLAGS, *LOCATION_FLAGS.values()}:
            hydra_args += token.split("=", 1)
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


@dataclass(frozen=True)
class ConfigSource:
    """Where a run's config is composed from: the primary config's directory and name, then
    further directories searched for group options (Hydra's ``--config-path``, ``--config-name``
    and ``--config-dir``; the folder of a recipe given by path)."""

    primary: Path = field(default_factory=lambda: config_dir())
    name: str = "config"
    extra: tuple[Path, ...] = ()

    @property
    def directories(self) -> tuple[Path, ...]:
        """Every directory searched, in Hydra's order: the primary one first."""
        return (self.primary, *self.extra)

    def overrides(self, overrides: list[str]) -> list[str]:
        """``overrides`` with the extra directories added to ``hydra.searchpath``."""
        if not self.extra:
            return overrides
        given = [o for o in overrides if override_key(o) == "hydra.searchpath"]
        paths = override_value(given[-1]) if given else []
        paths = [*(paths if isinstance(paths, list) else [paths]), *(f"file://{d}" for d in self.extra)]
        kept = [o for o in overrides if o not in given]
        return [*kept, f"hydra.searchpath=[{','.join(dict.fromkeys(str(p) for p in paths))}]"]

    def flags(self) -> list[str]:
        """The command-line flags that make another trainrun process compose from here."""
        return ["--config-path", str(self.primary), "--config-name", self.name]


def locate(hydra_args: list[str], overrides: list[str]) -> tuple[ConfigSource, list[str], list[str]]:
    """Read Hydra's config-location flags and recipes given by path.

    Returns the :class:`ConfigSource`, the remaining Hydra flags and the overrides, where
    ``recipe=PATH.yaml`` has become ``recipe=NAME`` found in a private copy of the file's folder.
    Relative directories are taken from the working directory (Hydra's ``--config-path`` is
    relative to the program's source, which means nothing for an installed command).
    """
    source, rest, index = ConfigSource(), [], 0
    while index < len(hydra_args):
        flag = hydra_args[index]
        long = next((name for name, short in LOCATION_FLAGS.items() if flag in (name, short)), None)
        if long is None:
            rest.append(flag)
            index += 1
            continue
        value = hydra_args[index + 1]
        index += 2
        if long == "--config-name":
            source = replace(source, name=value.removesuffix(".yaml"))
            continue
        directory = Path(value).expanduser().resolve()
        if not directory.is_dir():
            raise ConfigError(f"bad value for '{long}': directory '{value}' not found")
        if long == "--config-dir":
            source = replace(source, extra=(*source.extra, directory))
        else:
            source = replace(source, primary=directory)
    located, copied = [], []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "recipe" and value.endswith((".yaml", ".yml")):
            copies = [_recipe_copy(Path(path)) for path in value.split(",")]
            copied += [folder for folder, _ in copies]
            override = "recipe=" + ",".join(name for _, name in copies)
        located.append(override)
    return _users_first(source, copied), rest, located


def _users_first(source: ConfigSource, copied: list[Path]) -> ConfigSource:
    """``source`` searching the user's folders (then recipes given by path) before trainrun's own
    ``conf/``, so that a user's ``recipe/mild.yaml`` is the ``mild`` a run gets.

    Hydra searches the primary config's folder first; when that is trainrun's own, a private
    folder holding a copy of its ``config.yaml`` takes its place. Each option of the user's that
    takes the place of one of trainrun's is named in one line on stderr.
    """
    own = config_dir()
    users = [d for d in source.directories if d != own]
    holding = [d for d in (*users, own) if (d / f"{source.name}.yaml").is_file()]
    primary = holding[0] if holding else source.primary  # Hydra looks for the primary config in one place
    if primary == own and (users or copied):
        primary = _primary_copy(own / f"{source.name}.yaml")
    searched = [d for d in (*users, *copied) if d != primary]
    for directory in (primary, *searched):
        for path in sorted(directory.glob("*/*.yaml")) if directory not in (own, *copied) else []:
            shadowed = own / path.parent.name / path.name
            if shadowed.is_file():
                option = f"{path.parent.name}={path.stem}"
                print(
                    f"trainrun: note: {option} is read from '{path}', not trainrun's own '{shadowed}'", file=sys.stderr
                )
    return replace(source, primary=primary, extra=(*searched, own))


def private_folder(prefix: str) -> Path:
    """A folder of this process's own in the temporary directory, removed when the process ends.

    Its name holds the process id, so the folders of trainrun processes that were killed (no exit
    handler runs after SIGKILL) are found and removed here, when their process is gone.
    """
    for stale in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = stale.name.removeprefix(prefix).split("-")[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _primary_copy(config: Path) -> Path:
    """A private folder holding a copy of ``config`` (gone when the process ends)."""
    folder = private_folder("trainrun-config-")
    shutil.copy(config, folder / config.name)
    return folder


def _recipe_copy(path: Path) -> tuple[Path, str]:
    """A private config folder holding ``path`` as option ``recipe/<stem>``.

    A recipe sets keys anywhere in the run's config, so a file without a ``# @package`` line is
    read as ``_global_``, like the shipped recipes. The folder goes when the process ends.
    """
    if not path.is_file():
        raise ConfigError(f"bad value for 'recipe': file '{path}' not found")
    read_yaml(path)  # a file that is not YAML is named as the user wrote it, not by its copy
    text = path.read_text()
    if not any(line.startswith("# @package") for line in text.splitlines()[:5]):
        text = "# @package _global_\n" + text
    folder = private_folder("trainrun-recipe-")
    (folder / "recipe").mkdir()
    (folder / "recipe" / path.name).with_suffix(".yaml").write_text(text)
    return folder, path.stem


def override_key(override: str) -> str:
    """The key of ``key=value``, without Hydra's ``+``/``++`` (add, force-add) prefixes."""
    return override.split("=", 1)[0].lstrip("+")


def override_value(override: str) -> object:
    """The value of ``key=value`` as Hydra's override grammar reads it (``[a,b]`` is a list)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([override])[0].value()
    except Exception:  # hydra raises several types; all mean an override it cannot read
        raise ConfigError(f"cannot parse override '{override}'") from None


def register_schema() -> None:
    """Register the schema with Hydra: ``trainrun_schema`` (the whole run, the base of
    ``conf/config.yaml``) and ``schema/algorithms/<name>`` (each algorithm's values, the base of
    ``conf/algorithms/<name>.yaml``). The schema is the one place every default is written."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="trainrun_schema", node=TrainConfig)
    for name, spec in SPECS.items():
        store.store(group="schema/algorithms", name=name, node={name: spec.config})


def _sweep_jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists of every job a (multi)run will launch."""
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


# options that are gone, and what a config says instead
RETIRED_OPTIONS = {
    ("algorithms", "bce_loss"): "'loss=bce' (the classifier bias starts at -ln C through model.initializers)",
}


def group_options(group: str, source: ConfigSource | None = None) -> list[str]:
    """The options of config group ``group`` (file names under <dir>/<group>/ of every directory)."""
    directories = (source or ConfigSource()).directories
    return sorted({path.stem for directory in directories for path in (directory / group).glob("*.yaml")})


def help_text(overrides: list[str], source: ConfigSource) -> str:
    """``trainrun --help``: the help template of the primary config (``hydra.help``) filled in as
    Hydra fills it, with the groups read from the config folders. Hydra's own ``--help`` deep-copies
    every registered schema once per group it lists (3 s here) and lists the schema's internal groups."""
    import string

    composed = compose(overrides, source, with_hydra=True)
    template = composed.hydra.help.template
    with open_dict(composed):
        del composed["hydra"]
    groups = sorted({path.parent.name for d in source.directories for path in d.glob("*/*.yaml")} - {"hydra"})
    listed = "\n".join(f"{group}: {', '.join(group_options(group, source))}" for group in groups)
    return string.Template(template).safe_substitute(APP_CONFIG_GROUPS=listed, CONFIG=OmegaConf.to_yaml(composed))


def _composition_message(error: Exception, source: ConfigSource) -> str:
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        if not group:
            searched = ", ".join(str(directory) for directory in source.directories)
            return f"bad value for '--config-name': no config '{option}.yaml' in {searched}"
        options = ", ".join(group_options(group, source))
        moved = f": it is now {RETIRED_OPTIONS[group, option]}" if (group, option) in RETIRED_OPTIONS else ""
        return f"unknown option '{option}' for '{group}'{moved} (choose from: {options})"
    if isinstance(error, OverrideParseException):
        detail = [line for line in str(error).splitlines() if line and not line.startswith(("Error", "See "))]
        return f"cannot parse override '{error.override.lstrip('+')}'" + (f": {detail[0]}" if detail else "")
    parse_error = _yaml_error_in(error)
    if parse_error is not None:  # a config file (--config-name, a recipe, an option) that is not YAML
        return yaml_error_message(parse_error)
    cause = error.__cause__ or error.__context__  # Hydra re-raises a group file's refusal inside its handler
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:  # a key or value the schema refuses, found while composing
        return describe_omegaconf_error(cause)
    text = " ".join(str(error).split())
    if "not in struct" in text or "To append to your config use" in text:
        key = text.split("'")[1] if "'" in text else text
        return unknown_key_message(key)
    return str(error).strip().splitlines()[0]


def _yaml_error_in(error: BaseException) -> Exception | None:
    """The YAML parse error behind ``error`` (Hydra re-raises it without the file), if any."""
    import yaml

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, yaml.YAMLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def compose(overrides: list[str], source: ConfigSource | None = None, with_hydra: bool = False) -> DictConfig:
    """The config Hydra composes for ``overrides`` (``with_hydra``: with Hydra's own settings under
    ``hydra``, as a run gets them); composition errors become :class:`ConfigError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    source = source or ConfigSource()
    register_schema()
    try:
        with initialize_config_dir(config_dir=str(source.primary), version_base="1.3"):
            return hydra_compose(
                config_name=source.name, overrides=source.overrides(opened(overrides)), return_hydra_config=with_hydra
            )
    except Exception as error:  # hydra raises several types; all mean a bad override
        raise ConfigError(_composition_message(error, source)) from error


@dataclass(frozen=True)
class CheckedRun:
    """A single run as :func:`check_run` composed and validated it: what it trains, the resolved
    config it writes, and its folder."""

    config: TrainConfig
    yaml: str
    run_dir: Path


def check(
    overrides: list[str], multirun: bool = False, files: bool = True, source: ConfigSource | None = None
) -> list[TrainConfig]:
    """Compose and validate every job of a (multi)run; the first bad one raises. ``files=False``
    leaves out whether the data and checkpoint files exist and the output folder can be made
    (printing a config needs none)."""
    return _checked_jobs(overrides, multirun, files, source)[0]


def check_run(overrides: list[str], source: ConfigSource | None = None) -> CheckedRun:
    """One run checked as :func:`check` checks it, with what it needs to start: a single run is
    composed and validated once, here."""
    (config,), (composed,), output = _checked_jobs(overrides, False, True, source)
    return CheckedRun(config, OmegaConf.to_yaml(composed, resolve=True), run_files.output_folder(str(output)))


def _checked_jobs(
    overrides: list[str], multirun: bool, files: bool, source: ConfigSource | None
) -> tuple[list[TrainConfig], list[DictConfig], str | None]:
    """Each job's validated config and its composition (without Hydra's settings), and the folder
    the (multi)run writes into where ``files`` asks for it."""
    try:
        jobs = _sweep_jobs(overrides, multirun)
    except Exception as error:
        raise ConfigError(" ".join(str(error).split())) from error
    for job in jobs:
        refuse_repeated_methods(job)
    configs, composed_jobs, output = [], [], None
    output_key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    for index, job in enumerate(jobs):
        composed = compose(job, source, with_hydra=files and index == 0)
        refuse_dropped_methods(job, composed, lambda without: compose(without, source))
        if "hydra" in composed:  # a sweep's jobs share the sweep's folder: the first job's says where
            output = str(OmegaConf.select(composed, output_key))
            with open_dict(composed):
                del composed["hydra"]
        configs.append(_validated(job, composed, files, notices=index == 0))
        composed_jobs.append(composed)
    if output is not None:
        run_files.check_output_dir(output_key, output)
        replicas = configs[0].launcher.fault_tolerance == "replicas"  # checked at launch: a node may join
        if not multirun and configs[0].resume is None and not replicas:
            run_files.check_no_earlier_run(output)
    return configs, composed_jobs, output


def job_yaml(overrides: list[str], source: ConfigSource | None = None) -> str:
    """What ``--cfg job`` prints (Hydra's job config), checked as :func:`check` does without files."""
    refuse_repeated_methods(overrides)
    composed = compose(overrides, source)
    refuse_dropped_methods(overrides, composed, lambda without: compose(without, source))
    _validated(overrides, composed, files=False, notices=True)
    return OmegaConf.to_yaml(composed)


def _validated(job: list[str], composed: DictConfig, files: bool, notices: bool) -> TrainConfig:
    """``composed`` (``job``'s config) validated; ``notices``: name the keys it sets by a former name."""
    if notices:
        for notice in former_name_notices(composed):
            print(f"trainrun: note: {notice}", file=sys.stderr)
    options = {override_key(o): str(override_value(o)) for o in job if override_key(o) in kinds.KIND_ORDER}
    refuse_unread_keys([override_key(o) for o in job], composed, options)
    kinds.fill_from_files(composed, {override_key(o) for o in job})  # a published shape, dataset.json's channels
    if getattr(kinds.specs("model").get(composed.model.name), "finds", None):  # a model a user brings
        leave_out_inapplicable(job, composed, lambda bare: validate(bare, files=False), notices)
    try:
        return validate(composed, files)
    except KindMismatch as error:
        raise ConfigError(error.naming(options)) from None
