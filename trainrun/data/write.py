"""Write image datasets to FFCV ``.beton`` files: an RGB ``image`` field and an integer ``label``.

Writing is atomic: FFCV writes to ``<out>.partial-<host>-<pid>`` beside the target, which is renamed
to ``<out>`` only once complete; an interrupted write leaves no file under the target name.
Progress is a rich bar on a terminal and a line when a write starts and ends anywhere else
(a CI log), in place of FFCV's own tqdm bar.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from trainrun.errors import DataError


@dataclass
class WriteSettings:
    """How images are stored. The defaults follow the published ImageNet setups."""

    mode: str = "proportion"  # raw | jpg | proportion (JPEG with probability compress_probability)
    max_resolution: int = 500  # longest side after writing
    jpeg_quality: int = 90
    compress_probability: float = 0.5
    num_workers: int = 2
    chunk_size: int = 100


class NumpyImages:
    """Any indexed ``(image, label)`` dataset with images as HWC uint8 arrays, as FFCV wants them.

    Accepts PIL images, uint8 tensors (C, H, W) and HWC arrays. FFCV's writer waits forever for a
    worker whose sample raised, so a failing sample is recorded in ``error_file`` and replaced by
    a 1-pixel placeholder; :func:`write_beton` then discards the file and reports the error.
    """

    def __init__(self, dataset: Any, error_file: Path) -> None:
        self.dataset, self.error_file = dataset, error_file

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        try:
            return self._convert(*self.dataset[index])
        except Exception as error:
            samples = getattr(self.dataset, "samples", None)  # an ImageFolder names its files
            where = f"'{samples[index][0]}'" if samples else f"sample {index}"
            with open(self.error_file, "a", encoding="utf-8") as handle:
                handle.write(f"{where}: {type(error).__name__}: {error}\n")
            return np.zeros((1, 1, 3), dtype=np.uint8), 0

    @staticmethod
    def _convert(image: Any, label: Any) -> tuple[np.ndarray, int]:
        if isinstance(image, Image.Image):
            array = np.asarray(image.convert("RGB"))
        elif isinstance(image, torch.Tensor):
            array = image.permute(1, 2, 0).numpy()
        else:
            array = np.asarray(image)
        return np.ascontiguousarray(array, dtype=np.uint8), int(label)


def write_beton(dataset: Any, out: Path, settings: WriteSettings, console: Console | None = None) -> Path:
    """Write ``dataset`` to ``out`` atomically, showing progress on ``console`` (stdout by default); return ``out``."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    if len(dataset) == 0:
        raise DataError(f"nothing to write to '{out}': the source is empty")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.partial-{socket.gethostname()}-{os.getpid()}")  # nodes may share a disk
    errors = out.with_name(f"{out.name}.errors-{os.getpid()}")
    fields = {
        "image": RGBImageField(
            write_mode=settings.mode,
            max_resolution=settings.max_resolution,
            compress_probability=settings.compress_probability,
            jpeg_quality=settings.jpeg_quality,
        ),
        "label": IntField(),
    }
    console = console or Console(highlight=False)
    started = time.monotonic()
    try:
        writer = DatasetWriter(str(partial), fields, num_workers=settings.num_workers)
        with _progress_instead_of_tqdm(console, f"writing {len(dataset):,} images to {out}"):
            writer.from_indexed_dataset(NumpyImages(dataset, errors), chunksize=settings.chunk_size)
        if errors.exists():
            failures = errors.read_text(encoding="utf-8").splitlines()
            raise DataError(
                f"cannot write '{out}': {failures[0]}"
                + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else "")
            )
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
        errors.unlink(missing_ok=True)
    megabytes = out.stat().st_size / 2**20
    console.print(f"wrote {len(dataset):,} images to {out} ({megabytes:.1f} MiB, {time.monotonic() - started:.1f}s)")
    return out


@contextlib.contextmanager
def _progress_instead_of_tqdm(console: Console, label: str) -> Iterator[None]:
    """Show the progress FFCV's writer reports to ``ffcv.writer.tqdm`` as a rich bar on a terminal,
    or as one line elsewhere. FFCV has no option for its progress display: the name it calls is
    replaced for the duration of the write."""
    import ffcv.writer

    class Bar:
        def __init__(self, total: int) -> None:
            self.task = progress.add_task(label, total=total) if progress else None

        def update(self, count: int) -> None:
            if progress:
                progress.advance(self.task, count)

        def close(self) -> None:
            pass

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    progress = Progress(*columns, console=console, transient=True) if console.is_terminal else None
    if progress is None:
        console.print(label, highlight=False)
    original = ffcv.writer.tqdm
    ffcv.writer.tqdm = Bar
    try:
        with progress or contextlib.nullcontext():
            yield
    finally:
        ffcv.writer.tqdm = original


def source_dataset(source: str, split: str, builtin: Any) -> Any:
    """The dataset ``trainrun write`` reads: built-in set ``builtin`` or an ImageFolder at ``source``."""
    if builtin is not None:
        from trainrun.data.interface import datasets

        train, val = datasets(builtin, augment=False)
        return train if split == "train" else val
    root = Path(source).expanduser()
    if not root.is_dir():
        raise DataError(f"source '{source}' is neither a folder nor one of digits, mnist5k, synthetic")
    from torchvision.datasets import ImageFolder

    try:
        return ImageFolder(str(root))
    except (FileNotFoundError, RuntimeError) as error:
        raise DataError(f"no images in source folder '{root}': {str(error).splitlines()[0]}") from None
