"""The files a run writes into its folder, named once: the run and its loggers write them; the
commands that read finished runs (report, sweep, sample, recipe=auto, MLflow's upload) and the check
that a new run does not start in an earlier run's folder find them by these names."""

import os
from pathlib import Path

from trainrun.errors import ConfigError

CONFIG = "config.yaml"  # the composed config, resolved
METRICS = "metrics.jsonl"  # one row per evaluation
SUMMARY = "summary.json"  # written during the run, final at its end
STEPS = "steps.jsonl"  # one row per optimizer step: where its time went (rank 0)
CHECKPOINTS = "checkpoints"  # a folder of *.pt
MODEL = "model.pt"  # segmentation: the weights the final evaluation scored (a state dict), for ensembles
WEIGHTS = "model.safetensors"  # image classification: the final weights in the model's own layout (timm's)
AUTO_DECISION = "auto.json"  # what recipe=auto timed, predicted and chose


def output_folder(value: str) -> Path:
    """The folder ``hydra.run.dir`` or ``hydra.sweep.dir`` = ``value`` names: the one checked, the one written."""
    return Path(value).expanduser().absolute()


def check_output_dir(key: str, value: str) -> None:
    """The folder Hydra will write the run (or sweep) into, ``key`` = ``value``, can be made: no part
    of it is a file, and the deepest existing folder is writable (Hydra would fail with a traceback)."""
    folder = output_folder(value)
    for parent in [folder, *folder.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"bad value for '{key}': '{folder}' cannot be made: '{parent}' is a file")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(f"bad value for '{key}': '{folder}' cannot be made: '{parent}' is not writable")
            return


def check_output_file(key: str, path: Path) -> None:
    """The file ``key`` = ``path`` names can be written: its folder can be made (:func:`check_output_dir`)
    and it is not a folder."""
    check_output_dir(key, str(path.parent))
    if path.is_dir():
        raise ConfigError(f"bad value for '{key}': '{path}' is a folder; name the file to write")


EARLIER_RUN_FILES = (METRICS, SUMMARY, f"{CHECKPOINTS}/*.pt")


def check_no_earlier_run(value: str) -> None:
    """A new run (no ``resume``) does not start in a folder holding another run's records: its
    metrics would join the earlier run's and ``resume=auto`` could later pick the earlier run's
    checkpoint."""
    folder = output_folder(value)
    found = next((path for pattern in EARLIER_RUN_FILES for path in sorted(folder.glob(pattern))), None)
    if found is not None:
        raise ConfigError(
            f"bad value for 'hydra.run.dir': '{folder}' holds an earlier run ({found.relative_to(folder)}); "
            "continue it with resume=auto, or choose another folder"
        )
