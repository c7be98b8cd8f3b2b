"""``trainrun``'s entry layer: argv to training (:mod:`.train`) or to a subcommand, each its own
module here (write and write-text, sweep, report, explore, sample, consolidate, ensemble, predict, estimate,
lighthouse). Each composes and validates what it runs once, before any heavy import or process start,
and hands it on."""

from __future__ import annotations

import importlib
import sys

from trainrun.errors import report_error
from trainrun.provenance import record_command
from trainrun.versions import check_requirements

# Each subcommand's entry point, imported when it runs: (module, function taking argv).
SUBCOMMANDS = {
    "write": ("trainrun.commands.write", "write_command"),  # an image folder or built-in set to a .beton
    "write-text": ("trainrun.commands.write_text", "write_text_command"),  # a corpus to a token store
    "sweep": ("trainrun.commands.sweep", "run_sweep"),  # a recipe over budgets, seeds and folds
    "report": ("trainrun.commands.report", "report_command"),  # trade-off curves, time and cost to accuracy
    "explore": ("trainrun.commands.explore", "explore_command"),  # the trade-off curves as a web page
    "sample": ("trainrun.commands.sample", "sample_command"),  # a continuation from a finished causal-LM run
    "consolidate": ("trainrun.commands.consolidate", "consolidate_command"),  # a sharded checkpoint as one file
    "ensemble": ("trainrun.commands.ensemble", "ensemble_command"),  # segmentation folds averaged on held-out cases
    "predict": ("trainrun.commands.predict", "predict_command"),  # NIfTI label maps of a folder's images
    "estimate": ("trainrun.commands.estimate", "estimate_command"),  # a run's memory and time at its real size
    "lighthouse": ("trainrun.commands.lighthouse", "lighthouse_command"),  # fault-tolerant runs' lighthouse
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trainrun`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_requirements()
    except ImportError as error:  # a package below trainrun's floor: one line, before any work
        print(f"trainrun: error: {error}", file=sys.stderr)
        return 2
    record_command(argv)
    argv = subcommand_first(argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        from trainrun.commands.train import train_command

        return train_command(argv)
    try:
        return run_subcommand(argv[0], [a for a in argv[1:] if a != "--debug"])
    except KeyboardInterrupt:
        print("trainrun: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        return report_error(error, "--debug" in argv)


def subcommand_first(argv: list[str]) -> list[str]:
    """``trainrun -cd myconf estimate ...`` as ``trainrun estimate -cd myconf ...``: Hydra's config-location
    flags may come before a subcommand's name, as they come before a run's overrides."""
    if not argv or not argv[0].startswith(("-c", "--config")):
        return argv
    from trainrun.command_line import split_location_flags
    from trainrun.errors import ConfigError

    try:
        location, rest = split_location_flags(argv)
    except ConfigError:
        return argv  # a flag without its value: the command that reads it says so
    if location and rest and rest[0] in SUBCOMMANDS and argv[: len(location)] == location:
        return [rest[0], *location, *rest[1:]]
    return argv


def run_subcommand(name: str, argv: list[str]) -> int:
    module, function = SUBCOMMANDS[name]
    return getattr(importlib.import_module(module), function)(argv)
