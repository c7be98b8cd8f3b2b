"""``trainrun``: dispatch argv to training (Hydra) or a subcommand (write, sweep, report, sample).

The config is composed and validated (:mod:`trainrun.config`) before any heavy import or process
start; then Hydra's own entry point runs the job (``--cfg``, ``--help``, ``-m`` multirun all
work as in Hydra).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainrun.config import (
    AUTO_RECIPE,
    NO_RUN_FLAGS,
    OPTIMIZE_FLAG,
    PRINT_FLAGS,
    ConfigSource,
    check,
    help_text,
    job_yaml,
    locate,
    register_schema,
    translate,
)
from trainrun.errors import ConfigError, report_error
from trainrun.provenance import record_command
from trainrun.validation import validate
from trainrun.versions import check_requirements

HELP_FLAGS = {"-h", "--help"}  # trainrun's help (Hydra's own: --hydra-help)


def _job(cfg: DictConfig, debug: bool) -> None:
    """Hydra's task function: validate again (cheap) and train in the job's output directory."""
    from hydra.core.hydra_config import HydraConfig

    try:
        config = validate(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        from trainrun.launch import launch

        launch(config, run_dir, OmegaConf.to_yaml(cfg, resolve=True), debug)
    except KeyboardInterrupt:
        print("trainrun: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as error:
        raise SystemExit(report_error(error, debug)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trainrun`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_requirements()
    except ImportError as error:  # a package below trainrun's floor: one line, before any work
        print(f"trainrun: error: {error}", file=sys.stderr)
        return 2
    record_command(argv)
    debug = "--debug" in argv
    if argv and argv[0] in SUBCOMMANDS:
        try:
            return run_subcommand(argv[0], [a for a in argv[1:] if a != "--debug"])
        except KeyboardInterrupt:
            print("trainrun: interrupted", file=sys.stderr)
            return 130
        except Exception as error:
            return report_error(error, debug)
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
        if not NO_RUN_FLAGS & set(hydra_args):
            multirun = bool({"-m", "--multirun"} & set(hydra_args))
            check(overrides, multirun, files=not PRINT_FLAGS & set(hydra_args), source=source)
    except Exception as error:
        return report_error(error, debug)
    return _run_hydra(hydra_args + source.overrides(overrides), debug, source)


def _run_hydra(args: list[str], debug: bool, source: ConfigSource) -> int:
    import hydra

    register_schema()

    @hydra.main(version_base="1.3", config_path=str(source.primary), config_name=source.name)
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


# Each subcommand's entry point, imported when it runs: (module, function taking argv).
SUBCOMMANDS = {
    "write": ("trainrun.data.commands", "write_command"),  # an image folder or built-in set to a .beton
    "write-text": ("trainrun.data.commands", "write_text_command"),  # a corpus to a token store
    "sweep": ("trainrun.sweep", "run_sweep"),  # a recipe over budgets and seeds
    "report": ("trainrun.report.command", "report_command"),  # trade-off curves, time and cost to accuracy
    "sample": ("trainrun.sample", "sample_command"),  # a continuation from a finished causal-LM run
}


def run_subcommand(name: str, argv: list[str]) -> int:
    module, function = SUBCOMMANDS[name]
    return getattr(importlib.import_module(module), function)(argv)
