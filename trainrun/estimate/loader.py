"""A step's samples through the node's loaders, for ``trainrun estimate``: an image by the measured
costs of its loader's operations (``readings.yaml``'s ``image_ops``, from ``bench/loader_ops.py``), a
text window or a volume's crop by its loader's measured rate, each on the threads the node's CPU
leaves its loaders. Written here because the operations, the workers and the CPU facts are
trainrun's own.
"""

from __future__ import annotations

from trainrun import kinds
from trainrun.core.work import StepWork
from trainrun.estimate.datasheets import LoaderRate, rates
from trainrun.schema import TrainConfig


def loader_threads(config: TrainConfig, ranks_per_node: int) -> float | None:
    """Threads of the measuring machine a node's loaders are worth: the workers the run starts
    (``data.num_workers`` a rank; -1 the node's threads shared among its ranks, and so FFCV's 0; a
    torch loader's 0 one thread, in the training process) on the threads its training processes
    leave free, a core's second thread adding ``smt_yield`` of a core, at the CPU's speed a thread
    (None where the hardware states no cores)."""
    hardware, cpu = config.hardware, rates().cpu
    if not hardware.cpu_cores or not hardware.cpu_speed:
        return None
    threads = hardware.cpu_threads or hardware.cpu_cores
    busy = ranks_per_node * cpu.trainer_threads
    free_cores, free_threads = max(1, hardware.cpu_cores - busy), max(1, threads - busy)
    workers = config.data.num_workers
    if workers == -1 or (workers == 0 and config.data.loader == "ffcv"):
        workers = threads // ranks_per_node
    running = min(max(1, workers) * ranks_per_node, free_threads)
    return (min(running, free_cores) + cpu.smt_yield * max(0, running - free_cores)) * hardware.cpu_speed


def image_seconds(config: TrainConfig, work: StepWork) -> float:
    """What an image of ``work`` costs one thread of the measuring machine in the run's loader: FFCV's
    decode of the stored image (JPEG or raw pixels, in the share ``trainrun write`` stores by
    default) cropped to the side; the torch loader's decode (whole, or at the scale the crop needs),
    then its crop, flip and hand-over in a DataLoader worker, and the per-image augmentations."""
    from trainrun.data.write import WriteSettings

    ops, side = rates().image_ops, decoded_side(config, work)
    if config.data.loader == "ffcv":
        jpeg = WriteSettings().compress_probability
        return jpeg * ops.at("ffcv_jpeg", side) + (1 - jpeg) * ops.at("ffcv_raw", side)
    if config.data.decode == "draft":
        loaded = ops.at("draft", side)
    else:
        loaded = ops.decode_per_megapixel * ops.megapixels + ops.at("worker", side)
    return loaded + work.image_ops * ops.at("augment", side)


def node_image_seconds(config: TrainConfig, work: StepWork, threads: float) -> float:
    """An image's share of a node's loaders: its cost on one thread of the measuring machine over the
    ``threads`` they are worth, at the efficiency a node's image workers reach (``readings.yaml``'s
    ``cpu.image_loader_efficiency``, fitted on one published run)."""
    return image_seconds(config, work) / (threads * rates().cpu.image_loader_efficiency)


def loader_seconds(config: TrainConfig, work: StepWork, threads: float | None) -> float | None:
    """A step's samples through the loaders, each node loading its own share of the batch on the
    ``threads`` its loaders are worth (None: not timed)."""
    if threads is None:
        return None
    samples = config.train_batch_size / config.launcher.nnodes
    if images_decoded(config):
        return samples * node_image_seconds(config, work, threads)
    row = loader_row(config)
    if row is None:
        return None
    per_sample = work.sequence_length if row.unit == "tokens/s" else 1
    return samples * per_sample / (row.per_thread * threads)


def evaluation_loader_seconds(config: TrainConfig, threads: float | None) -> float | None:
    """One evaluation's samples through the loaders, each node loading its share of the validation
    set: an image decoded and brought to the evaluation's side without augmentation, or the text
    loader's validation tokens (None: not timed, as volumes' whole cases or an unsaid size)."""
    if threads is None:
        return None
    nodes = config.launcher.nnodes
    if images_decoded(config):
        if len(config.data.samples) < 2:
            return None
        side = config.data.eval_resolution
        work = StepWork(full_resolution=side, resolution=side)
        return config.data.samples[1] / nodes * node_image_seconds(config, work, threads)
    row = loader_row(config)
    if row is None or row.unit != "tokens/s" or not config.data.text.val_tokens:
        return None
    return config.data.text.val_tokens / nodes / (row.per_thread * threads)


def loader_timed(config: TrainConfig) -> bool:
    """Whether trainrun has measured the run's loader: an image loader's operations, or a row for the
    task's text or volumes."""
    return images_decoded(config) or loader_row(config) is not None


def loader_row(config: TrainConfig) -> LoaderRate | None:
    """The measured row of the run's text or volume loader (at its crop), None where there is none."""
    return rates().loader_rate(config.task.name, config.data.loader, crop_of(config))


def loader_notes(config: TrainConfig, threads: float | None) -> list[str]:
    """Why the loader is not timed, where it is not."""
    if not loader_timed(config):
        return [f"no loader rate measured for {config.task.name} with data.loader={config.data.loader}"]
    if threads is None:
        return [f"hardware={config.hardware.name} states no CPU cores and speed: the loader is not timed"]
    return []


def image_batches(config: TrainConfig) -> bool:
    """The run's batches are images (their side is a step's work)."""
    return kinds.spec_of("data", config.data.name).batches == "images"


def images_decoded(config: TrainConfig) -> bool:
    """The run's loader hands out images it decodes from files (a folder's, FFCV's), timed by the
    operations of decoding ImageNet's; images held in memory or generated (digits, synthetic) are not."""
    return image_batches(config) and bool(kinds.spec_of("data", config.data.name).reads)


def crop_of(config: TrainConfig) -> tuple[int, ...] | None:
    """A volume loader's training crop (its rate scales with the voxels), None for other data."""
    if kinds.spec_of("data", config.data.name).batches != "volumes":
        return None
    return tuple(config.data.segmentation.patch_size)


def decoded_side(config: TrainConfig, work: StepWork) -> int | None:
    """The side the loader decodes at: the phase's (or the one the run asks, where it shrinks batches
    on the device) where the loader decodes at the size asked (FFCV), else the full side."""
    if config.data.loader != "ffcv":
        return work.full_resolution
    return work.loaded_resolution or work.resolution


def loader_in_words(config: TrainConfig, work: StepWork, threads: float, ranks_per_node: int) -> str:
    """The loader as timed: its work an image (or the row used) on the measuring machine, and what
    the node's threads make of it."""
    hardware = config.hardware
    node = (
        f"x {threads:.1f} threads' worth on {hardware.name} ({hardware.cpu_cores} cores, "
        f"{hardware.cpu_threads or hardware.cpu_cores} threads at {hardware.cpu_speed:g}x a thread here, "
        f"{ranks_per_node} training process{'es' if ranks_per_node > 1 else ''})"
    )
    if images_decoded(config):
        side, seconds = decoded_side(config, work), image_seconds(config, work)
        augments = f", {work.image_ops:g} augmentation op(s)" if work.image_ops else ""
        what = f"data.loader={config.data.loader} at {side} px{augments}"
        efficiency = f", its image workers at {rates().cpu.image_loader_efficiency:.0%} of their single-thread rate"
        return f"{what}: {seconds * 1e3:.2f} ms an image a thread ({rates().image_ops.source}) {node}{efficiency}"
    row = loader_row(config)
    crop = " at " + " x ".join(map(str, row.crop)) if row.crop else ""
    rate = f"{row.per_thread:,.0f}" if row.per_thread >= 100 else f"{row.per_thread:.3g}"
    return f"{config.task.name} data.loader={row.loader}{crop}: {rate} {row.unit} a thread ({row.source}) {node}"
