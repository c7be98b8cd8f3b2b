"""Real .beton files written and read through FFCV: labels, sizes, sharding, resolution, bad files."""

import io
import json
import os
import re

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import read_metrics, run_here
from PIL import Image
from rich.console import Console

from trainrun.core.distributed import Placement
from trainrun.data.build import build_data, datasets
from trainrun.data.ffcv import FFCVData, check_beton
from trainrun.data.write import WriteSettings, write_beton
from trainrun.errors import ConfigError, DataError
from trainrun.schema import DataConfig, FFCVConfig
from trainrun.tasks.image_classification import ImageClassification

RAW = WriteSettings(mode="raw", max_resolution=64, num_workers=1)


class Indexed:
    """Label = index, so each sample can be recognised after loading."""

    def __init__(self, count, size=(12, 10)):
        self.count, self.size = count, size

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return np.full((*self.size, 3), index % 256, dtype=np.uint8), index


def beton_config(train, val, num_classes, **kwargs):
    return DataConfig(
        name="beton",
        loader="ffcv",
        train=str(train),
        val=str(val),
        num_classes=num_classes,
        **{"num_workers": 1, **kwargs},
    )


@pytest.fixture(scope="module")
def indexed_betons(tmp_path_factory):
    root = tmp_path_factory.mktemp("betons")
    write_beton(Indexed(64), root / "train.beton", RAW)
    write_beton(Indexed(20, size=(30, 40)), root / "val.beton", RAW)
    return root / "train.beton", root / "val.beton"


@pytest.mark.slow
def test_digits_labels_round_trip_exactly(tmp_path):
    train, _ = datasets(DataConfig(name="digits"), augment=False)
    write_beton(train, tmp_path / "d.beton", RAW)
    config = beton_config(tmp_path / "d.beton", tmp_path / "d.beton", 10, resolution=8, eval_resolution=8)
    data = FFCVData(config, 64, 100, seed=0, device=torch.device("cpu"))
    labels, images = [], []
    for batch, targets in data.eval_batches():  # sequential order: the stored order
        labels.append(targets.clone())  # FFCV reuses its batch buffers
        images.append(batch.clone())
    assert torch.equal(torch.cat(labels), train.labels)
    assert torch.equal(torch.cat(images), train.images)  # raw mode at native size: pixel-exact
    assert images[0].is_contiguous(memory_format=torch.channels_last)  # views of FFCV's NHWC buffers
    task = ImageClassification(config)
    prepared = task.normalise(images[0])
    assert prepared.is_contiguous()  # NCHW, made while normalising
    assert torch.allclose(prepared, (images[0].float() - task.mean) / task.std)
    nhwc = task.normalise(images[0], torch.channels_last)  # a channels-last run: the same values, NHWC
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and torch.equal(nhwc, prepared)


def test_decoded_sizes_and_resolution_change_on_the_next_epoch(indexed_betons):
    train, val = indexed_betons
    config = beton_config(train, val, 64, resolution=8, eval_resolution=16, eval_resize=20)
    data = build_data(config, 16, 8, seed=0)
    images, _ = next(data.train_batches(0))
    assert images.shape == (16, 3, 8, 8) and images.dtype == torch.uint8
    images, _ = next(iter(data.eval_batches()))
    assert images.shape == (8, 3, 16, 16)
    assert data.set_train_resolution(12)
    assert all(images.shape[-1] == 12 for images, _ in data.train_batches(1))
    assert data.batches_per_epoch == 4


def test_ffcv_loaders_leave_torchs_thread_count_as_the_run_set_it(indexed_betons):
    """FFCV sets torch's threads to its worker count as a loader is built and each epoch starts; the
    run's count stays (ranks sharing a node's cores, a test worker's one thread)."""
    train, val = indexed_betons
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = build_data(beton_config(train, val, 64, num_workers=2), 16, 8, seed=0)
        assert torch.get_num_threads() == 1
        next(data.train_batches(0))  # an epoch's start
        next(iter(data.eval_batches()))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_epochs_cover_every_sample_once_in_a_new_order(indexed_betons, monkeypatch):
    """... and a resume at batch 2 of 4 reads only the remaining 32 samples, in the epoch's order."""
    train, val = indexed_betons
    data = build_data(beton_config(train, val, 64), 16, 8, seed=3)
    first = torch.cat([labels.clone() for _, labels in data.train_batches(0)])
    second = torch.cat([labels.clone() for _, labels in data.train_batches(1)])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(64))
    assert not torch.equal(first, second)
    again = torch.cat([labels.clone() for _, labels in data.train_batches(0)])
    assert torch.equal(first, again)  # an epoch's order depends on the seed and epoch only
    import ffcv.loader.loader as ffcv_loader

    decoded = []  # what FFCV's epoch iterator is given is what it reads and decodes
    real_iterator = ffcv_loader.EpochIterator
    monkeypatch.setattr(
        ffcv_loader, "EpochIterator", lambda loader, order: decoded.append(len(order)) or real_iterator(loader, order)
    )
    resumed = torch.cat([labels.clone() for _, labels in data.train_batches(0, skip=2)])
    assert torch.equal(resumed, first[32:]) and decoded == [32]
    assert torch.equal(torch.cat([labels.clone() for _, labels in data.train_batches(0)]), first)  # skip: once


class Patterned:
    """8x8 images whose every pixel differs and none is 0 (value = 4 x (8 x row + column) + 3), label = index."""

    def __init__(self, count):
        self.count = count
        self.image = (np.arange(64, dtype=np.uint8).reshape(8, 8) * 4 + 3)[:, :, None].repeat(3, axis=2)

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return self.image, index


def _augmented(data, epoch):
    """Epoch ``epoch``'s training images (channel 0) by sample index."""
    return {int(y): x[0].clone() for images, labels in data.train_batches(epoch) for x, y in zip(images, labels)}


@pytest.mark.slow
def test_ffcv_augmentation_is_keyed_to_seed_epoch_and_sample(tmp_path):
    """Flip and translation draw from (seed, epoch, sample) alone: the same per sample whatever the
    loader threads or batch size (so whatever the ranks), new each epoch, fair in distribution."""
    write_beton(Patterned(128), tmp_path / "p.beton", RAW)
    settings = dict(resolution=8, crop_scale=[1.0, 1.0], crop_ratio=[1.0, 1.0], random_crop_padding=2, hflip=True)
    config = beton_config(tmp_path / "p.beton", tmp_path / "p.beton", 128, **settings)
    one_thread = FFCVData(config, 16, 64, seed=5, device=torch.device("cpu"))
    config2 = beton_config(tmp_path / "p.beton", tmp_path / "p.beton", 128, **{**settings, "num_workers": 2})
    two_threads = FFCVData(config2, 32, 64, seed=5, device=torch.device("cpu"))
    other_seed = FFCVData(config, 16, 64, seed=6, device=torch.device("cpu"))
    first, again = _augmented(one_thread, 0), _augmented(two_threads, 0)
    assert sorted(first) == list(range(128))
    assert all(torch.equal(first[i], again[i]) for i in first)
    second, elsewhere = _augmented(one_thread, 1), _augmented(other_seed, 0)
    assert sum(not torch.equal(first[i], second[i]) for i in first) > 100  # new draws each epoch
    assert sum(not torch.equal(first[i], elsewhere[i]) for i in first) > 100
    assert all(torch.equal(a, b) for a, b in zip(_augmented(one_thread, 1).values(), second.values()))

    pattern = torch.from_numpy(Patterned(1).image[:, :, 0]).int()
    flips, shifts = 0, set()
    for image in [*first.values(), *second.values()]:
        image = image.int()
        row = next(r for r in image if (r > 0).sum() >= 2)
        kept = row[row > 0]
        flipped = bool(kept[0] > kept[-1])  # the pattern grows left to right
        flips += flipped
        shifted = image.flip(-1) if flipped else image  # flip runs after translation
        top, left = (shifted > 0).nonzero()[0].tolist()
        value = (int(shifted[top, left]) - 3) // 4
        dy, dx = top - value // 8, left - value % 8
        shifts.add((dy, dx))
        expected = torch.zeros_like(pattern)  # the pattern moved by (dy, dx), zeros where it left
        expected[max(0, dy) : 8 + min(0, dy), max(0, dx) : 8 + min(0, dx)] = pattern[
            max(0, -dy) : 8 - max(0, dy), max(0, -dx) : 8 - max(0, dx)
        ]
        assert torch.equal(shifted, expected)
    assert 0.35 < flips / 256 < 0.65
    assert shifts == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}  # every offset of the 5x5 drawn


def _rank_labels(rank, world_size, train, val, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    data = build_data(beton_config(train, val, 64), 16, 8, seed=1, placement=Placement(rank, world_size))
    epochs = [sorted(torch.cat([y.clone() for _, y in data.train_batches(e)]).tolist()) for e in range(2)]
    evaluation = sorted(torch.cat([y.clone() for _, y in data.eval_batches()]).tolist())
    queue.put((rank, epochs, evaluation))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_split_each_epoch_without_overlap(indexed_betons):
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_rank_labels, args=(2, *map(str, indexed_betons), 29531, queue), nprocs=2, start_method="spawn")
    results = dict((rank, (epochs, evaluation)) for rank, epochs, evaluation in (queue.get(), queue.get()))
    for epoch in range(2):
        a, b = results[0][0][epoch], results[1][0][epoch]
        assert len(a) == len(b) == 32 and not set(a) & set(b) and sorted(a + b) == list(range(64))
    a, b = results[0][1], results[1][1]
    assert not set(a) & set(b) and sorted(a + b) == list(range(20))  # evaluation: no padding


def test_quasi_random_with_ranks_is_a_clear_error(indexed_betons):
    with pytest.raises(ConfigError, match="quasi_random cannot be combined"):
        FFCVData(
            beton_config(*indexed_betons, 64, ffcv=FFCVConfig(order="quasi_random")),
            8,
            8,
            0,
            torch.device("cpu"),
            Placement(0, 2),
        )


def test_bad_betons(indexed_betons, tmp_path):
    train, _ = indexed_betons
    with pytest.raises(DataError, match="does not exist"):
        check_beton(tmp_path / "missing.beton", 10)
    truncated = tmp_path / "truncated.beton"
    truncated.write_bytes(train.read_bytes()[: train.stat().st_size // 2])
    with pytest.raises(DataError, match="truncated|not a readable"):
        check_beton(truncated, 64)
    garbage = tmp_path / "garbage.beton"
    garbage.write_bytes(b"not a beton" * 100)
    with pytest.raises(DataError, match="not a readable .beton"):
        check_beton(garbage, 64)
    with pytest.raises(DataError, match="label 63 outside 0..9"):
        check_beton(train, 10)
    from ffcv.fields import FloatField, RGBImageField
    from ffcv.writer import DatasetWriter

    other = tmp_path / "other.beton"
    DatasetWriter(str(other), {"picture": RGBImageField(), "score": FloatField()}, num_workers=1).from_indexed_dataset(
        [(np.zeros((4, 4, 3), np.uint8), 0.5)] * 3
    )
    with pytest.raises(DataError, match="needs fields image"):
        check_beton(other, 10)


class Failing(Indexed):
    def __getitem__(self, index):
        if index == 40:
            raise RuntimeError("source broke")
        return super().__getitem__(index)


def test_interrupted_write_leaves_no_file(tmp_path):
    out = tmp_path / "out.beton"
    with pytest.raises(DataError, match="sample 40: RuntimeError: source broke"):
        write_beton(Failing(64), out, WriteSettings(mode="raw", num_workers=1, chunk_size=8))
    assert list(tmp_path.iterdir()) == []


def test_a_write_from_a_folder_with_an_unreadable_image_names_the_file(tmp_path):
    from trainrun.data.write import source_dataset

    _jpeg_folder(tmp_path / "src")
    (tmp_path / "src" / "bee" / "broken.jpg").write_text("not an image")
    out = tmp_path / "out.beton"
    with pytest.raises(DataError, match=r"^cannot write '.*out.beton': '.*bee/broken.jpg': UnidentifiedImageError"):
        write_beton(source_dataset(str(tmp_path / "src"), "train", None), out, WriteSettings(mode="raw", num_workers=1))
    assert not out.exists()


def _jpeg_folder(root, classes=("ant", "bee"), per_class=6):
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (rng.integers(20, 40), rng.integers(20, 40), 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.jpg")


@pytest.mark.slow
def test_write_command_and_training_on_betons(tmp_path):
    """``trainrun write`` and a run on what it wrote, in this process (FFCV's numba compilation paid
    once): the commands' output and exit codes as the console script gives them."""
    _jpeg_folder(tmp_path / "train")
    _jpeg_folder(tmp_path / "val")
    for split in ("train", "val"):
        beton = str(tmp_path / f"{split}.beton")
        result = run_here("write", str(tmp_path / split), beton, "--max-resolution", "32", "--workers", "1")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()  # not a terminal: one line per stage, no progress bars
        assert lines[:2] == [
            f"reading image folder {tmp_path / split}",
            f"writing 12 images to {tmp_path / split}.beton",
        ]
        assert len(lines) == 3 and lines[2].startswith(f"wrote 12 images to {tmp_path / split}.beton ("), lines
        assert result.stderr == ""
    again = run_here("write", str(tmp_path / "train"), str(tmp_path / "train.beton"))
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
    synthetic = run_here("write", "synthetic", str(tmp_path / "s.beton"), "--workers", "1", "data.num_samples=8")
    assert synthetic.returncode == 0 and "wrote 8 images" in synthetic.stdout, synthetic.stderr  # overrides after flags
    run_dir = tmp_path / "run"
    betons = ["data=imagenet_ffcv", f"data.train={tmp_path / 'train.beton'}", f"data.val={tmp_path / 'val.beton'}"]
    betons += ["data.num_classes=2", "data.num_workers=1", "model=resnet_small"]
    shape = ["data.resolution=16", "data.eval_resolution=16", "data.eval_resize=20", "model.resnet_small.width=8"]
    shape += ["train_batch_size=4", "eval_batch_size=4", "max_duration=2ep", "progress=false"]
    result = run_here(*betons, *shape, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    assert "(ffcv)" in result.stdout and [r["batch"] for r in read_metrics(run_dir)] == [3, 6]
    bad = run_here(*betons, f"hydra.run.dir={tmp_path / 'bad'}", "train_batch_size=64")
    assert bad.returncode == 2 and "larger than the training images" in bad.stderr.strip().splitlines()[-1]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"  # untouched


def test_writing_on_a_terminal_shows_a_rich_progress_bar(tmp_path, capsys):
    screen = io.StringIO()
    write_beton(Indexed(300), tmp_path / "t.beton", RAW, Console(file=screen, force_terminal=True, width=300))
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue()).replace("\n", "")  # colours and cursor moves
    assert f"writing 300 images to {tmp_path / 't.beton'}" in shown and "━" in shown  # rich's bar
    assert "wrote 300 images" in shown
    assert capsys.readouterr() == ("", "")  # nothing from FFCV's own tqdm bar


def test_missing_beton_fails_before_any_work(tmp_path):
    result = run_here("data=imagenet_ffcv", f"data.train={tmp_path / 'no.beton'}", f"data.val={tmp_path / 'no.beton'}")
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert "data=beton needs 'data.train'" in run_here("data=imagenet_ffcv").stderr
