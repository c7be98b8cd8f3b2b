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


class FileFormatError(TrainrunError):
    """A file trainrun reads is damaged or not the kind of file it should be."""


class TrainingDiverged(TrainrunError):
    """The loss became NaN or infinite."""

    exit_code = 3


class RunPreempted(TrainrunError):
    """A scheduler's notice stopped the run at a checkpoint; ``resume=auto`` continues it."""

    exit_code = 75  # EX_TEMPFAIL (trainrun.core.preemption)


class WriteError(TrainrunError):
    """A file of the run could not be written (disk full, no permission); what was written before stays."""

    exit_code = 1


class NodeUnreachable(TrainrunError):
    """Another node of the run, or its lighthouse, did not answer."""

    exit_code = 1


def describe_error(error: BaseException) -> tuple[str, int]:
    """The one line (without the ``trainrun: error:`` prefix) and exit code for ``error``."""
    if isinstance(error, TrainrunError):
        return str(error), error.exit_code
    return f"{type(error).__name__}: {error} (rerun with --debug for the traceback)", 1


def report_error(error: BaseException, debug: bool, where: str = "") -> int:
    """Print ``error`` as one line (``where`` names the rank, if any); return the exit code."""
    if debug:
        raise error
    text, code = describe_error(error)
    print(f"trainrun: error: {where}{text}", file=sys.stderr)
    return code
