"""``trainrun [KEY=VALUE ...]``: a training run, or Hydra's multirun and printing flags.

The config is composed and validated once (:mod:`trainrun.config`) before any heavy import or
process start. A single run starts from that composition; the workers of a launch on several
devices receive the validated config itself. With Hydra's own flags (``-m``, ``--cfg hydra``,
``--info``...) Hydra's entry point runs, and its jobs take the configs checked here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainrun.config import (
    AUTO_RECIPE,
    NO_RUN_FLAGS,
    OPTIMIZE_FLAG,
    PRINT_FLAGS,
    CheckedRun,
    ConfigSource,
    check,
    check_run,
    help_text,
    job_yaml,
    locate,
    register_schema,
    translate,
)
from trainrun.errors import ConfigError, report_error
from trainrun.schema import TrainConfig

HELP_FLAGS = {"-h", "--help"}  # trainrun's help (Hydra's own: --hydra-help)


def train_command(argv: list[str]) -> int:
    """Train what ``argv`` composes; the exit code (2: bad input, before anything starts)."""
    debug = "--debug" in argv
    try:
        hydra_args, overrides, debug = translate(argv)
        source, hydra_args, overrides = locate(hydra_args, overrides)
        optimize = OPTIMIZE_FLAG in hydra_args
        if optimize or AUTO_RECIPE in overrides:
            hydra_args = [a for a in hydra_args if a != OPTIMIZE_FLAG]
            if hydra_args:
                raise ConfigError(
                    f"recipe=auto and -o1 decide one training run: they do not combine with '{hydra_args[0]}'"
                )
            from rich.console import Console

            from trainrun.choose import before_run

            overrides = before_run(overrides, source, optimize, Console(highlight=False))
        if HELP_FLAGS & set(hydra_args):
            print(help_text(overrides, source), end="")
            return 0
        if hydra_args == ["--cfg", "job"]:  # printed from the one composition that checks it
            print(job_yaml(overrides, source), end="")
            return 0
        if not hydra_args:
            return _run(check_run(overrides, source), debug)
        checked = []
        if not NO_RUN_FLAGS & set(hydra_args):
            multirun = bool({"-m", "--multirun"} & set(hydra_args))
            checked = check(overrides, multirun, files=not PRINT_FLAGS & set(hydra_args), source=source)
    except Exception as error:
        return report_error(error, debug)
    return _run_hydra(hydra_args + source.overrides(overrides), debug, source, checked)


def _run(run: CheckedRun, debug: bool) -> int:
    """Train a checked run in its folder, here or in one process per device."""
    from trainrun.launch import launch

    try:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        launch(run.config, run.run_dir, run.yaml, debug)
    except KeyboardInterrupt:
        print("trainrun: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        return report_error(error, debug)
    return 0


def _job(cfg: DictConfig, debug: bool, checked: list[TrainConfig]) -> None:
    """Hydra's task function: train the job's checked config in the job's output directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra = HydraConfig.get()
    config = checked[hydra.job.num if hydra.mode == RunMode.MULTIRUN else 0]
    code = _run(CheckedRun(config, OmegaConf.to_yaml(cfg, resolve=True), Path(hydra.runtime.output_dir)), debug)
    if code:
        raise SystemExit(code)


def _run_hydra(args: list[str], debug: bool, source: ConfigSource, checked: list[TrainConfig]) -> int:
    import hydra

    register_schema()

    @hydra.main(version_base="1.3", config_path=str(source.primary), config_name=source.name)
    def entry(cfg: DictConfig) -> None:
        _job(cfg, debug, checked)

    saved_argv = sys.argv
    sys.argv = ["trainrun", *args]
    try:
        entry()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0
