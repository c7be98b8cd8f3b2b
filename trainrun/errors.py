"""Errors that mean "the user's input is wrong": the CLI prints them as one line and exits non-zero."""

import sys


class TrainrunError(Exception):
    """A problem the user can fix; its message is shown alone, without a traceback."""

    exit_code = 2


class ConfigError(TrainrunError):
    """The composed configuration is invalid."""


class DataError(TrainrunError):
    """A data set is missing, empty or inconsistent with the config."""


class CheckpointError(TrainrunError):
    """A checkpoint cannot be found or read."""


class TrainingDiverged(TrainrunError):
    """The loss became NaN or infinite."""

    exit_code = 3


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
