"""``trainrun``: argv → Hydra overrides → validated config → a run.

Composer-style flags (``--algorithms ema blurpool``, ``--optimizer.lr 0.4``) are translated to
Hydra overrides. The config is composed and validated here, before any heavy import or process
start, so a bad key, value or path fails at once with one line and exit code 2. Then Hydra's
own entry point runs the job (``--cfg``, ``--help``, ``-m`` multirun all work as in Hydra).
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainrun.errors import ConfigError, TrainrunError
from trainrun.schema import TrainConfig, list_keys, validate, value_keys

HYDRA_FLAGS = {"-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "--resolve", "-r", "--run"}
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--experimental-rerun"}
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


def force_schema_keys(overrides: list[str]) -> list[str]:
    """Prefix overrides of schema keys with ``++``, so that keys a YAML option leaves out can be set.

    Hydra refuses ``data.cache_dir=...`` when the selected ``data`` option does not list
    ``cache_dir``; every key of the schema is settable, so those are forced. Other keys are left
    alone and fail as unknown.
    """
    known = value_keys()
    forced = []
    for override in overrides:
        key = override.split("=", 1)[0]
        forced.append(f"++{override}" if "=" in override and key in known else override)
    return forced


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
    text = " ".join(str(error).split())
    if "not in struct" in text or "To append to your config use" in text:
        key = text.split("'")[1] if "'" in text else text
        return f"unknown config key '{key}'"
    return str(error).strip().splitlines()[0]


def compose(overrides: list[str]) -> DictConfig:
    """The config Hydra composes for ``overrides``; composition errors become :class:`ConfigError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except Exception as error:  # hydra raises several types; all mean a bad override
        raise ConfigError(_composition_message(error)) from error


def check(overrides: list[str], multirun: bool = False) -> list[TrainConfig]:
    """Compose and validate every job of a (multi)run; the first bad one raises."""
    try:
        jobs = _sweep_jobs(overrides, multirun)
    except Exception as error:
        raise ConfigError(" ".join(str(error).split())) from error
    return [validate(compose(job)) for job in jobs]


def report_error(error: BaseException, debug: bool, where: str = "") -> int:
    """Print ``error`` as one line (``where`` names the rank, if any); return the exit code."""
    if debug:
        raise error
    if isinstance(error, TrainrunError):
        print(f"trainrun: error: {where}{error}", file=sys.stderr)
        return error.exit_code
    print(
        f"trainrun: error: {where}{type(error).__name__}: {error} (rerun with --debug for the traceback)",
        file=sys.stderr,
    )
    return 1


def _job(cfg: DictConfig, debug: bool) -> None:
    """Hydra's task function: validate again (cheap) and train in the job's output directory."""
    from hydra.core.hydra_config import HydraConfig

    try:
        config = validate(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        from trainrun.launch import launch

        launch(config, run_dir, OmegaConf.to_yaml(cfg, resolve=True))
    except KeyboardInterrupt:
        print("trainrun: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as error:
        raise SystemExit(report_error(error, debug)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trainrun`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    if argv and argv[0] in SUBCOMMANDS:
        try:
            return SUBCOMMANDS[argv[0]]([a for a in argv[1:] if a != "--debug"])
        except KeyboardInterrupt:
            print("trainrun: interrupted", file=sys.stderr)
            return 130
        except Exception as error:
            return report_error(error, debug)
    try:
        hydra_args, overrides, debug = translate(argv)
        overrides = force_schema_keys(overrides)
        if not NO_RUN_FLAGS & set(hydra_args):
            check(overrides, multirun=bool({"-m", "--multirun"} & set(hydra_args)))
    except Exception as error:
        return report_error(error, debug)
    return _run_hydra(hydra_args + overrides, debug)


def _run_hydra(args: list[str], debug: bool) -> int:
    import hydra

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def entry(cfg: DictConfig) -> None:
        _job(cfg, debug)

    saved_argv = sys.argv
    sys.argv = ["trainrun", *args]
    try:
        entry()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0


def write_command(argv: list[str]) -> int:
    """``trainrun write SRC OUT.beton``: an image folder or a built-in set to an FFCV file."""
    import argparse

    from trainrun.data.write import WriteSettings

    defaults = WriteSettings()
    parser = argparse.ArgumentParser(
        prog="trainrun write",
        description="Write an ImageFolder tree (SRC/<class>/*.jpg) or a built-in set (digits, mnist5k, "
        "synthetic) to an FFCV .beton with an RGB 'image' and an integer 'label' field.",
    )
    parser.add_argument("source", help="a folder of class folders, or digits | mnist5k | synthetic")
    parser.add_argument("out", type=Path, help="the .beton file to write (atomically)")
    parser.add_argument("--mode", choices=["raw", "jpg", "proportion"], default=defaults.mode)
    parser.add_argument("--max-resolution", type=int, default=defaults.max_resolution)
    parser.add_argument("--jpeg-quality", type=int, default=defaults.jpeg_quality)
    parser.add_argument("--compress-probability", type=float, default=defaults.compress_probability)
    parser.add_argument("--workers", type=int, default=defaults.num_workers)
    parser.add_argument("--split", choices=["train", "val"], default="train", help="built-in sets: which split")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("overrides", nargs="*", help="data.* overrides for built-in sets, e.g. data.num_samples=4096")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"'{args.out}' exists; pass --overwrite to replace it")
    if not 0 <= args.compress_probability <= 1:
        raise ConfigError(f"bad value for '--compress-probability': {args.compress_probability} (0 to 1)")
    settings = WriteSettings(
        mode=args.mode,
        max_resolution=args.max_resolution,
        jpeg_quality=args.jpeg_quality,
        compress_probability=args.compress_probability,
        num_workers=args.workers,
    )
    from trainrun.data.write import source_dataset, write_beton

    dataset = source_dataset(args.source, args.split, _builtin_data_config(args.source, args.overrides))
    write_beton(dataset, args.out, settings)
    print(f"wrote {len(dataset)} images to {args.out}")
    return 0


def _builtin_data_config(source: str, overrides: list[str]):
    """The data config of built-in set ``source`` (None for a folder), with ``data.*`` overrides."""
    from trainrun.schema import DATA_NAMES

    if source not in DATA_NAMES:
        return None
    return validate(compose(force_schema_keys([f"data={source}", *overrides]))).data


def sweep_command(argv: list[str]) -> int:
    """``trainrun sweep [OVERRIDES] budgets=[...] [seeds=[...]] [out=DIR]``: a recipe over budgets."""
    from trainrun.sweep import run_sweep

    return run_sweep(argv)


def report_command(argv: list[str]) -> int:
    """``trainrun report DIR...``: trade-off curves, time/cost to accuracy, bottlenecks."""
    from trainrun.report.build import report_command as build_report

    return build_report(argv)


SUBCOMMANDS = {"write": write_command, "sweep": sweep_command, "report": report_command}
