"""FFCV loaders: decode, augment and move batches with FFCV's compiled pipelines.

Training: random-resized-crop decoder at the configured resolution (its ``output_size`` can
change between epochs), optional translate and flip, to tensor, to the device (non-blocking; no step on
the CPU), to a torch image. Evaluation: center-crop decoder with ratio ``eval_resolution / eval_resize``.
Batches are (N, 3, H, W) views of FFCV's (N, H, W, 3) buffers, so channels-last in memory:
no copy on the loader's thread. The image task converts them to the run's memory format on
the device in the same pass that normalises them. Built-in sets are written once to
``data.cache_dir`` and reused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from trainrun.core.distributed import SINGLE_PROCESS, Placement, cores_per_process
from trainrun.data.builtin import builtin_identity
from trainrun.data.cache import cache_prefix, write_once_per_node
from trainrun.data.interface import DataSpec
from trainrun.data.write import WriteSettings, write_beton
from trainrun.errors import ConfigError, DataError
from trainrun.schema import DataConfig


def check_beton(path: Path, num_classes: int) -> int:
    """Open ``path`` as a trainrun ``.beton``; return its sample count or raise :class:`DataError`."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.reader import Reader

    if not path.is_file():
        raise DataError(f"'{path}' does not exist")
    try:
        reader = Reader(str(path))
    except Exception as error:  # FFCV raises many types on damaged headers
        raise DataError(f"'{path}' is not a readable .beton file ({type(error).__name__}: {error})") from None
    fields = {name: type(handler) for name, handler in reader.handlers.items()}
    if fields.get("image") is not RGBImageField or fields.get("label") is not IntField:
        found = ", ".join(f"{k}: {v.__name__}" for k, v in fields.items())
        raise DataError(f"'{path}' needs fields image (RGBImageField) and label (IntField); it has {found}")
    table = reader.alloc_table
    if len(table) and int((table["ptr"] + table["size"]).max()) > path.stat().st_size:
        raise DataError(f"'{path}' is truncated: its data runs past the end of the file")
    labels = reader.metadata[f"f{reader.field_names.index('label')}"]
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"'{path}' has label {int(labels.max() if labels.max() >= num_classes else labels.min())} "
            f"outside 0..{num_classes - 1} (data.num_classes={num_classes})"
        )
    return reader.num_samples


def cached_betons(config: DataConfig, placement: Placement) -> tuple[Path, Path]:
    """Paths of a built-in set written to ``cache_dir``, once, atomically, by each node's local rank 0.

    Every node writes its own copy when ``cache_dir`` is on the node's own disk; on a filesystem the
    nodes share, the first complete write wins and identical later ones replace it atomically.
    """
    prefix = cache_prefix(config.cache_dir, config.name, builtin_identity(config))
    paths = prefix.with_name(f"{prefix.name}-train.beton"), prefix.with_name(f"{prefix.name}-val.beton")

    def write() -> None:
        from trainrun.data.interface import datasets

        settings = WriteSettings(mode="raw", max_resolution=max(config.resolution, config.eval_resolution))
        for dataset, path in zip(datasets(config, augment=False), paths):
            if not path.is_file():
                write_beton(dataset, path, settings)

    write_once_per_node(prefix, lambda: all(path.is_file() for path in paths), write, placement)
    return paths


def _device_stage(device: torch.device) -> list:
    """The copy to ``device`` that ends a pipeline (one instance per pipeline: FFCV operations are
    not shared); on the CPU the batch is where it must be already, and FFCV's ToDevice would copy it."""
    from ffcv.transforms import ToDevice

    return [] if device.type == "cpu" else [ToDevice(device, non_blocking=True)]


def _label_pipeline(device: torch.device) -> list:
    from ffcv.fields.basics import IntDecoder
    from ffcv.transforms import Squeeze, ToTensor

    return [IntDecoder(), ToTensor(), Squeeze(), *_device_stage(device)]


def beton_files(config: DataConfig, placement: Placement = SINGLE_PROCESS, augment: bool = True) -> tuple[Path, Path]:
    """``data=beton``: the user's training and validation files, already in FFCV's format."""
    return Path(config.train).expanduser(), Path(config.val).expanduser()


def _beton_files(config: DataConfig, placement: Placement) -> tuple[Path, Path, int]:
    """The training and validation files (the user's, or built-in sets written once), checked,
    and the validation set's size."""
    if config.ffcv.order == "quasi_random" and placement.world_size > 1:
        raise ConfigError(
            "data.ffcv.order=quasi_random cannot be combined with distributed training (FFCV has no "
            "distributed quasi-random order); use data.ffcv.order=random"
        )
    files = beton_files if config.name == "beton" else cached_betons
    train_path, val_path = files(config, placement)
    check_beton(train_path, config.num_classes)
    return train_path, val_path, check_beton(val_path, config.num_classes)


def _eval_pipeline(config: DataConfig, device: torch.device) -> list:
    """A center crop of ``eval_resolution``, from the shorter side resized to ``eval_resize`` if given."""
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder
    from ffcv.transforms import ToTensor, ToTorchImage

    ratio = config.eval_resolution / config.eval_resize if config.eval_resize else 1.0
    decoder = CenterCropRGBImageDecoder((config.eval_resolution, config.eval_resolution), ratio=ratio)
    return [decoder, ToTensor(), *_device_stage(device), ToTorchImage()]


class ResumableOrder:
    """FFCV's traversal order of a loader, started ``skip`` samples into the epoch.

    FFCV decodes every sample of the order it is given; an order that starts at a mid-epoch
    resume's first sample reads nothing twice (FFCV's Loader takes no start position). The order
    itself is FFCV's (seeded by epoch; split among ranks), so the remaining batches are the
    uninterrupted run's.
    """

    def __init__(self, order: Any) -> None:
        self.order, self.skip = order, 0

    def sample_order(self, epoch: int) -> Sequence[int]:
        return self.order.sample_order(epoch)[self.skip :]


@contextlib.contextmanager
def torch_threads_kept() -> Iterator[None]:
    """FFCV sets torch's intra-op threads to its loader's worker count when a loader is built and as
    each epoch starts (``Compiler.set_num_threads``): the run's own count (its share of the cores,
    ``OMP_NUM_THREADS``) is put back, so that ranks sharing a node do not oversubscribe its cores."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class FFCVData(DataSpec):
    """FFCV loaders for one rank."""

    def __init__(
        self,
        config: DataConfig,
        per_rank_batch: int,
        eval_batch: int,
        seed: int,
        device: torch.device,
        placement: Placement = SINGLE_PROCESS,
    ) -> None:
        from ffcv.loader import Loader, OrderOption

        from trainrun.data.ffcv_keyed import SampleKeys

        train_path, val_path, val_count = _beton_files(config, placement)
        self.keys = SampleKeys(seed)  # augmentation keyed to (seed, epoch, sample): reproducible runs
        workers = {0: -1, -1: cores_per_process()}.get(config.num_workers, config.num_workers)  # FFCV's -1: every core
        with torch_threads_kept():
            self.train = Loader(
                str(train_path),
                batch_size=per_rank_batch,
                num_workers=workers,
                order=OrderOption[config.ffcv.order.upper()],
                os_cache=config.ffcv.os_cache,
                drop_last=config.ffcv.drop_last,
                distributed=placement.world_size > 1,
                seed=seed,
                batches_ahead=config.ffcv.batches_ahead,
                pipelines={"image": self._train_pipeline(config, device), "label": _label_pipeline(device)},
            )
            self.eval = Loader(
                str(val_path),
                batch_size=eval_batch,
                num_workers=workers,
                order=OrderOption.SEQUENTIAL,
                os_cache=config.ffcv.os_cache,
                drop_last=False,
                indices=list(range(placement.rank, val_count, placement.world_size)),
                batches_ahead=config.ffcv.batches_ahead,
                pipelines={"image": _eval_pipeline(config, device), "label": _label_pipeline(device)},
            )
        self.order = ResumableOrder(self.train.traversal_order)
        self.train.traversal_order = self.order
        self.batches_per_epoch = len(self.train)
        if self.batches_per_epoch == 0:
            raise DataError(
                f"train_batch_size {per_rank_batch * placement.world_size} is larger than the training images in "
                f"'{train_path}'"
            )

    def _train_pipeline(self, config: DataConfig, device: torch.device) -> list:
        """Keyed random-resized crop (its size changes with progressive resizing), translate, flip."""
        from ffcv.transforms import ToTensor, ToTorchImage

        from trainrun.data.ffcv_keyed import KeyedHorizontalFlip, KeyedRandomResizedCrop, KeyedTranslate

        size, scale, ratio = (config.resolution, config.resolution), tuple(config.crop_scale), tuple(config.crop_ratio)
        self.decoder = KeyedRandomResizedCrop(self.keys, size, scale, ratio)
        augment = [KeyedTranslate(self.keys, config.random_crop_padding)] if config.random_crop_padding else []
        augment += [KeyedHorizontalFlip(self.keys)] if config.hflip else []
        return [self.decoder, *augment, ToTensor(), *_device_stage(device), ToTorchImage()]

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator:
        """Epoch ``epoch``'s batches from batch ``skip`` on: the skipped ones are never read."""
        self.train.next_epoch = epoch
        self.keys.set_epoch(epoch)
        self.order.skip = skip * self.train.batch_size
        try:
            with torch_threads_kept():
                return iter(self.train)  # takes the epoch's order now
        finally:
            self.order.skip = 0

    def eval_batches(self) -> Iterable:
        with torch_threads_kept():
            return iter(self.eval)

    def set_train_resolution(self, size: int) -> bool:
        self.decoder.output_size = (size, size)
        return True
