"""Errors that mean "the user's input is wrong": the CLI prints them as one line and exits non-zero."""


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
