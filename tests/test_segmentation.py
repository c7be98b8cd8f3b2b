"""Segmentation: Dice and the loss by hand, the store's preprocessing, crops, inference, runs."""

from __future__ import annotations

import gzip
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import killed_and_resumed, read_metrics, run_here, write_decathlon_task

from trainrun.config import compose
from trainrun.data.segmentation import biased_crop, by_class, fold_cases, gaussian_blur, store_path, synthetic_case
from trainrun.data.volume_store import VolumeStore, preprocess
from trainrun.errors import ConfigError, DataError, TrainrunError
from trainrun.schema import DataConfig, SegmentationDataConfig
from trainrun.tasks.segmentation import DiceCrossEntropy, Segmentation, build, volume_dice
from trainrun.validation import validate

# a run small enough for a 2-core CPU: 10 volumes of 8x24x24, a 3-level UNet on 16x16 crops
TINY_SEG = ["task=segmentation", "data=synthetic_brats", "model=unet2d", "model.unet.filters=[8,16,32]"]
TINY_SEG += ["model.unet.strides=[1,2,2]", "data.segmentation.patch_size=[16,16]", "progress=false"]
TINY_SEG += ["data.segmentation.synthetic_shape=[8,24,24]", "data.segmentation.synthetic_cases=10"]
TINY_SEG += ["train_batch_size=8", "eval_batch_size=2", "optimizer=radam", "optimizer.lr=3e-3", "scheduler=constant"]


def one_hot_logits(label: torch.Tensor, classes: int) -> torch.Tensor:
    """Logits (K, *spatial) whose arg-max is ``label``."""
    return F.one_hot(label, classes).movedim(-1, 0).float() * 10


# ------------------------------------------------------------------------------ metric and loss
def test_volume_dice_counts_by_hand_and_scores_an_empty_class_one_only_when_predicted_empty():
    label = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 0]])
    predicted = torch.tensor([[0, 1, 1, 0], [1, 2, 0, 0]])
    dice = volume_dice(one_hot_logits(predicted, 4), label)
    # class 1: overlap 2, |pred| 3, |label| 3 -> 4/6; class 2: overlap 1, 1 + 2 -> 2/3; class 3: both empty -> 1
    assert dice.tolist() == pytest.approx([4 / 6, 2 / 3, 1.0])
    wrongly = torch.tensor([[0, 1, 1, 3], [0, 2, 2, 0]])  # class 3 predicted where the label has none
    assert volume_dice(one_hot_logits(wrongly, 4), label).tolist() == pytest.approx([4 / 5, 1.0, 0.0])


def test_the_loss_is_soft_dice_over_the_foreground_classes_of_the_batch_plus_cross_entropy():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 3, 4, 5), torch.randint(0, 3, (2, 4, 5))
    probabilities, truth = logits.softmax(1), F.one_hot(labels, 3).movedim(-1, 1).float()
    dice_losses = []
    for cls in (1, 2):  # the background left out; sums over the whole batch and every voxel
        overlap = (probabilities[:, cls] * truth[:, cls]).sum()
        total = probabilities[:, cls].sum() + truth[:, cls].sum()
        dice_losses.append(1 - (2 * overlap + 1e-5) / (total + 1e-5))
    expected = sum(dice_losses) / 2 + F.cross_entropy(logits, labels)
    assert DiceCrossEntropy()(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)


BRATS21 = [[1, 2, 3], [1, 3], [3]]  # whole tumour, tumour core, enhancing tumour (labels 1 NCR, 2 ED, 3 ET)


def test_region_dice_scores_each_nested_region_of_logits_above_zero_by_hand():
    label = torch.tensor([[0, 1, 2, 3, 3, 0]])
    # predicted regions (logit > 0): whole tumour on voxels 1-4, core on 3-5, enhancing on none
    logits = torch.tensor([[[-1, 1, 1, 1, 1, 0]], [[-1, -1, -1, 1, 1, 1]], [[-1.0] * 6]])  # 0: not predicted
    dice = volume_dice(logits, label, BRATS21)
    # WT truth {1,2,3,4}: exact -> 1; TC truth {1,3,4} vs {3,4,5}: overlap 2 -> 4/6; ET truth {3,4} vs {} -> 0
    assert dice.tolist() == pytest.approx([1.0, 4 / 6, 0.0])
    assert volume_dice(torch.full((3, 1, 6), -1.0), torch.zeros(1, 6, dtype=torch.long), BRATS21).tolist() == [1.0] * 3


def test_the_region_loss_sums_each_regions_sigmoid_dice_over_the_batch_and_its_bce():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 3, 4, 5), torch.randint(0, 4, (2, 4, 5))
    expected = 0.0
    for r, region in enumerate(BRATS21):
        mask = sum((labels == label).float() for label in region)
        probability = logits[:, r].sigmoid()
        dice = 1 - (2 * (probability * mask).sum() + 1e-5) / (probability.sum() + mask.sum() + 1e-5)
        expected += dice + F.binary_cross_entropy(probability, mask)
    task = Segmentation(DataConfig(num_classes=4, segmentation=SegmentationDataConfig(regions=BRATS21)))
    assert task.loss("soft_ce")(logits, labels).item() == pytest.approx(expected.item(), rel=1e-5)
    assert task.scored == 3 and set(task.metrics) == {"dice", "dice_1", "dice_2", "dice_3"}


def test_the_evaluator_averages_each_class_over_volumes_then_the_classes():
    task = Segmentation(DataConfig(num_classes=3))
    state = type("S", (), {"num_classes": 3, "device": torch.device("cpu"), "world_size": 1})()
    evaluator = task.evaluator(state)
    first = torch.tensor([[1, 1, 2, 0]])
    second = torch.tensor([[1, 0, 0, 0]])
    evaluator.update([one_hot_logits(first, 3), one_hot_logits(torch.tensor([[1, 0, 0, 0]]), 3)], [first, second])
    metrics = evaluator.compute()
    # volume 1 exact (1, 1); volume 2: class 1 exact, class 2 empty in both (1): every Dice is 1
    assert metrics["dice"] == metrics["dice_1"] == metrics["dice_2"] == 1.0
    evaluator = task.evaluator(state)
    evaluator.update([one_hot_logits(torch.tensor([[0, 1, 2, 0]]), 3)], [first])
    metrics = evaluator.compute()
    assert (metrics["dice_1"], metrics["dice_2"]) == pytest.approx((2 / 3, 1.0))
    assert metrics["dice"] == pytest.approx((2 / 3 + 1) / 2)
    assert task.quality == "dice" and set(task.metrics) == {"dice", "dice_1", "dice_2"}
    four = Segmentation(DataConfig(num_classes=4)).evaluator(state)  # three foreground classes
    label = torch.tensor([[0, 1, 2, 3]])
    four.update([one_hot_logits(torch.tensor([[0, 1, 2, 0]]), 4)], [label])
    assert [four.compute()[f"dice_{k}"] for k in (1, 2, 3)] == [1.0, 1.0, 0.0]


def test_evaluation_sums_dice_and_loss_in_float64_on_the_runs_device_then_adds_the_other_ranks(monkeypatch):
    import trainrun.tasks.segmentation as segmentation

    task = Segmentation(DataConfig(num_classes=4, segmentation=SegmentationDataConfig(regions=BRATS21)))
    meta = task.evaluator(SimpleNamespace(device=torch.device("meta"), world_size=1))
    assert meta.sums.device.type == "meta" and meta.sums.dtype == torch.float64
    labels = [torch.tensor([[0, 1, 2, 3]]), torch.tensor([[3, 3, 0, 0]])]
    logits = [torch.randn(3, 1, 4, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    losses = [task.loss("soft_ce")(out[None], label[None]).item() for out, label in zip(logits, labels)]
    dices = [volume_dice(out, label, BRATS21) for out, label in zip(logits, labels)]
    other_rank = torch.tensor([2.0, 1.0, 0.0, 7.0, 2.0], dtype=torch.float64)  # 3 Dice sums, loss sum, volumes
    monkeypatch.setattr(segmentation.dist, "all_reduce", lambda sums: sums.add_(other_rank))
    evaluator = task.evaluator(SimpleNamespace(device=torch.device("cpu"), world_size=2))
    evaluator.update(logits, labels)
    metrics = evaluator.compute()
    each = [(float(dices[0][r] + dices[1][r]) + other_rank[r].item()) / 4 for r in range(3)]
    assert [metrics[f"dice_{r}"] for r in (1, 2, 3)] == pytest.approx(each)
    assert metrics["dice"] == pytest.approx(sum(each) / 3)
    assert metrics["eval_loss"] == pytest.approx((sum(losses) + 7.0) / 4)


# ------------------------------------------------------------------------------ inference
def test_sliding_windows_equal_whole_volume_inference_where_the_volume_fits_and_blend_to_it_elsewhere():
    torch.manual_seed(0)
    task = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8, 8])))
    conv = torch.nn.Conv3d(2, 3, 3, padding=1).eval()
    volume = torch.randn(2, 8, 8, 8)
    (windowed,) = task.predict(conv, [volume])
    torch.testing.assert_close(windowed, conv(volume[None])[0])
    pointwise = torch.nn.Conv3d(2, 3, 1).eval()  # the same answer in every window: blending must keep it
    large = torch.randn(2, 13, 9, 20)
    (windowed,) = task.predict(pointwise, [large])
    assert windowed.shape == (3, 13, 9, 20)
    torch.testing.assert_close(windowed, pointwise(large[None])[0], rtol=1e-5, atol=1e-5)


def test_windows_are_patch_sized_half_overlapping_and_gaussian_blended_as_nnunet_infers():
    from monai.inferers import sliding_window_inference

    torch.manual_seed(0)
    task = build(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8, 8])))
    conv = torch.nn.Conv3d(2, 3, 3, padding=1).eval()
    seen = []
    conv.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape))
    volume = torch.randn(2, 20, 8, 8)
    (logits,) = task.predict(conv, [volume])
    assert {shape[1:] for shape in seen} == {(2, 8, 8, 8)}
    assert sum(shape[0] for shape in seen) == 4  # starts 0, 4, 8, 12 along the 20 voxels: a step of half a patch
    expected = sliding_window_inference(volume[None], [8, 8, 8], 64, conv, overlap=0.5, mode="gaussian")[0]
    torch.testing.assert_close(logits, expected)
    constant = sliding_window_inference(volume[None], [8, 8, 8], 64, conv, overlap=0.5, mode="constant")[0]
    assert not torch.allclose(logits, constant)  # the blending weights matter where windows overlap
    batch = torch.randn(2, 2, 8, 8, 8)  # a training-shaped batch: one forward pass
    torch.testing.assert_close(task.predict(conv, batch), conv(batch))


def test_training_batches_go_to_the_device_in_the_runs_memory_format_and_volumes_as_lists():
    task = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8])))
    state = SimpleNamespace(device=torch.device("cpu"), memory_format=torch.channels_last)
    images, labels = torch.randn(3, 4, 8, 8), torch.randint(0, 4, (3, 8, 8))
    inputs, targets, count = task.batch([images, labels], state)
    assert inputs.is_contiguous(memory_format=torch.channels_last) and torch.equal(inputs, images)
    assert torch.equal(targets, labels) and count == 3
    volumes = [(torch.randn(4, 2, 8, 8), torch.zeros(2, 8, 8, dtype=torch.long)) for _ in range(2)]
    inputs, targets, count = task.batch(volumes, state)
    assert count == 2 and all(torch.equal(a, b) for a, (b, _) in zip(inputs, volumes, strict=True))
    assert all(torch.equal(a, b) for a, (_, b) in zip(targets, volumes, strict=True))
    gpu = SimpleNamespace(device=torch.device("meta"), memory_format=torch.contiguous_format)  # as a GPU run
    inputs, targets, _ = task.batch([images, labels], gpu)
    assert inputs.device.type == targets.device.type == "meta"
    inputs, targets, _ = task.batch(volumes, gpu)
    assert {tensor.device.type for tensor in [*inputs, *targets]} == {"meta"}


def test_a_2d_model_predicts_every_axial_slice_of_the_volume():
    task = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8])))
    conv = torch.nn.Conv2d(2, 3, 3, padding=1).eval()
    volume = torch.randn(2, 5, 8, 8)
    (logits,) = task.predict(conv, [volume])
    assert logits.shape == (3, 5, 8, 8)
    for depth in range(5):
        torch.testing.assert_close(logits[:, depth], conv(volume[None, :, depth])[0])


# ------------------------------------------------------------------------------ data
def test_preprocessing_crops_to_the_nonzero_box_and_z_scores_each_channel_over_it():
    rng = np.random.default_rng(0)
    image = np.zeros((2, 6, 7, 8), np.float32)
    image[:, 1:4, 2:6, 3:5] = rng.uniform(1, 5, (2, 3, 4, 2))
    image[0, 1, 2, 3] = 0  # a zero inside the box of channel 1's non-zero voxels
    label = np.zeros((6, 7, 8), np.uint8)
    label[2, 3, 4] = 2
    cropped, cropped_label = preprocess(image, label)
    assert cropped.shape == (2, 3, 4, 2) and cropped.dtype == np.float32 and cropped_label[1, 1, 1] == 2
    for channel in range(2):
        values = image[channel, 1:4, 2:6, 3:5]
        expected = (values - values.mean()) / values.std()  # every voxel of the box is non-zero in some channel
        np.testing.assert_allclose(cropped[channel], expected, atol=2e-3)


def test_the_synthetic_set_is_deterministic_with_nested_regions_and_cases_missing_a_class():
    image, label = synthetic_case(3, (16, 32, 32))
    again, same = synthetic_case(3, (16, 32, 32))
    assert np.array_equal(image, again) and np.array_equal(label, same)
    assert image.shape == (4, 16, 32, 32) and set(np.unique(label)) == {0, 1, 2, 3}
    assert (image[:, label > 0] != 0).all()  # tumour lies inside the brain
    _, no_rim = synthetic_case(9, (16, 32, 32))
    _, healthy = synthetic_case(19, (16, 32, 32))
    assert 3 not in np.unique(no_rim) and set(np.unique(healthy)) == {0}


@pytest.mark.parametrize("rate", [0.0, 0.33, 1.0])
def test_crops_contain_foreground_at_the_configured_rate(rate):
    label = np.zeros((1, 64, 64), np.uint8)
    label[0, 40:44, 10:14] = 1  # a small lesion: a uniform 16x16 crop holds some of it in about 9 % of draws
    image = np.ones((1, 1, 64, 64), np.float32)
    from trainrun.data.volume_store import foreground_locations

    foreground = by_class(foreground_locations(label, 2, 0))
    torch.manual_seed(0)
    draws = 2000
    hits = sum(bool(biased_crop(image, label, foreground, [1, 16, 16], rate)[1].any()) for _ in range(draws))
    uniform = (19 * 19) / (49 * 49)  # start positions (of 49 per axis) whose crop overlaps the lesion
    expected = rate + (1 - rate) * uniform
    assert hits / draws == pytest.approx(expected, abs=4 * math.sqrt(expected * (1 - expected) / draws) + 1e-9)


def test_a_crop_pads_a_volume_smaller_than_the_patch_and_keeps_image_and_label_aligned():
    image = np.arange(2 * 3 * 5, dtype=np.float32).reshape(1, 2, 3, 5) + 1
    label = (image[0] % 2).astype(np.uint8)
    torch.manual_seed(0)
    crop, crop_label = biased_crop(image, label, [], [4, 4, 4], 0.5)
    assert crop.shape == (1, 4, 4, 4) and crop_label.shape == (4, 4, 4)
    inside = crop[0] != 0
    assert inside.sum() == 2 * 3 * 4  # one of the five columns cut, zero padding around the rest
    assert torch.equal(crop_label[inside], (crop[0][inside] % 2).long())


def test_gaussian_blur_keeps_the_mean_of_a_constant_and_matches_torchvisions_in_2d():
    from torchvision.transforms.v2.functional import gaussian_blur as reference

    torch.manual_seed(0)
    image = torch.rand(2, 20, 20)
    ours = gaussian_blur(image, 1.0)
    theirs = reference(F.pad(image[None], (3, 3, 3, 3), mode="replicate")[0], [7, 7], [1.0, 1.0])[:, 3:-3, 3:-3]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert torch.allclose(gaussian_blur(torch.full((1, 5, 5, 5), 2.0), 0.7), torch.tensor(2.0))


def test_folds_are_scikit_learns_seeded_kfold_and_partition_the_cases():
    from sklearn.model_selection import KFold

    seen = []
    for fold in range(5):
        train, val = fold_cases(23, 5, fold, 0)
        expected = list(KFold(5, shuffle=True, random_state=0).split(range(23)))[fold]
        assert (train, val) == (expected[0].tolist(), expected[1].tolist())
        assert sorted(train + val) == list(range(23))
        seen += val
    assert sorted(seen) == list(range(23))


def write_decathlon_folder(root, cases=3, values=(0, 1, 2, 3)):
    """A Decathlon-layout task folder of ``cases`` 4-channel NIfTI volumes whose labels take
    ``values`` (BraTS21's are 0, 1, 2, 4), and their arrays."""
    rng = np.random.default_rng(0)
    arrays = {}
    for index in range(cases):
        image = np.zeros((10, 12, 6, 4), np.float32)  # NIfTI's (x, y, z, channel)
        image[2:8, 3:11, 1:5] = rng.uniform(0.5, 3.0, (6, 8, 4, 4))
        label = np.zeros((10, 12, 6), np.uint8)
        label[4:6, 5:8, 2:4] = values[index % 3 + 1]
        arrays[f"BRATS_{index:03d}"] = image, label
    modality = {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}
    labels = dict(zip(map(str, values), ["background", "edema", "non-enhancing tumor", "enhancing tumour"]))
    write_decathlon_task(root, "BRATS", arrays, modality, labels)
    return arrays


def test_fewer_cases_than_folds_is_refused_with_one_line_naming_the_folds():
    with pytest.raises(DataError, match=r"^bad value for 'data.segmentation.folds': 5 but the data set has 4 cases"):
        fold_cases(4, 5, 0, 0)
    train, val = fold_cases(5, 5, 4, 0)
    assert len(val) == 1 and sorted(train + val) == list(range(5))


def test_a_decathlon_folder_is_read_from_nifti_preprocessed_and_stored_once(tmp_path):
    arrays = write_decathlon_folder(tmp_path / "Task01_BrainTumour")
    config = DataConfig(name="decathlon", path=str(tmp_path / "Task01_BrainTumour"), cache_dir=str(tmp_path / "c"))
    store = VolumeStore.open(store_path(config))
    assert store.cases == tuple(sorted(arrays)) and store.channels == ("FLAIR", "T1w", "t1gd", "T2w")
    assert store.labels[3] == "enhancing tumour"
    for case, name in enumerate(store.cases):
        image, label = arrays[name]
        box = image[2:8, 3:11, 1:5].transpose(3, 2, 1, 0)  # (C, z, y, x): nnU-Net's order, axial slices first
        expected = (box - box.mean(axis=(1, 2, 3), keepdims=True)) / box.std(axis=(1, 2, 3), keepdims=True)
        np.testing.assert_allclose(store.image(case), expected, atol=3e-3)
        assert np.array_equal(store.label(case), label[2:8, 3:11, 1:5].transpose(2, 1, 0))
        locations = store.locations(case)
        assert len(locations) == 2 * 3 * 2 and set(locations[:, 0]) == {case % 3 + 1}
    written = (store.path / "index.json").stat().st_mtime_ns
    assert store_path(config) == store.path and (store.path / "index.json").stat().st_mtime_ns == written


def test_label_values_become_class_indices_in_dataset_jsons_order(tmp_path):
    arrays = write_decathlon_folder(tmp_path / "brats21", values=(0, 1, 2, 4))
    config = DataConfig(name="decathlon", path=str(tmp_path / "brats21"), cache_dir=str(tmp_path / "c"))
    store = VolumeStore.open(store_path(config))
    assert store.labels == ("background", "edema", "non-enhancing tumor", "enhancing tumour")
    for case, name in enumerate(store.cases):
        value = arrays[name][1].max()
        assert store.label(case).max() == (3 if value == 4 else value)  # 4 stored as class 3


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.segmentation.patch_size=[24,24]"], "bad value for 'data.segmentation.patch_size': [24, 24]"),
        (["data.segmentation.patch_size=[32,32,32]"], "model.unet.dimensions 2 sides"),
        (["model=resnet_small"], "'resnet_small' (with task=segmentation it must be unet or module)"),
        (["data=digits"], "bad value for 'data.name': 'digits'"),
        (["algorithms=[blurpool]"], "algorithm 'blurpool' does not apply to task segmentation"),
        (["data.segmentation.fold=5"], "bad value for 'data.segmentation.fold': 5"),
        (["data.segmentation.synthetic_cases=4"], "bad value for 'data.segmentation.synthetic_cases': 4 (at least"),
        (["model.unet.strides=[1,2]"], "bad value for 'model.unet.filters'"),
        (["loss=bce"], "trains with Dice + cross-entropy"),
        (["data.segmentation.regions=[[1,2,3],[2,3],[3]]"], "has 3 regions (one output each)"),
        (["data.segmentation.regions=[[1,4]]", "model.num_classes=1"], "the foreground labels 1 to 3"),
        (["model=unet3d", "data.segmentation.patch_size=[32,32,32]"], "which instance norm cannot normalise"),
        (["data.segmentation.mirror_axes=[1,3]"], "bad value for 'data.segmentation.mirror_axes': [1, 3]"),
        (["data.segmentation.mirror_axes=[1,1]"], "distinct volume axes"),
        (["model.unet.deep_supervision=5"], "bad value for 'model.unet.deep_supervision': 5 (at most 4"),
        (["data.segmentation.window_batch=0"], "bad value for 'data.segmentation.window_batch': 0"),
        (["data.segmentation.blend_device=gpu"], "bad value for 'data.segmentation.blend_device'"),
    ],
)
def test_a_segmentation_config_is_refused_with_one_line_naming_the_key(overrides, message):
    base = ["task=segmentation", "data=synthetic_brats", "model=unet2d"]
    with pytest.raises(ConfigError) as error:
        validate(compose([*base, *overrides]), files=False)
    assert message in str(error.value)


def test_the_decathlon_source_needs_a_folder_with_dataset_json(tmp_path):
    config = compose(["task=segmentation", "data=decathlon", "model=unet2d", f"data.path={tmp_path}"])
    with pytest.raises(ConfigError, match="data=decathlon needs 'data.path': a Decathlon task folder"):
        validate(config)


PATCH_3D = ["data.segmentation.patch_size=[32,64,64]"]


def test_channels_last_takes_the_3d_layout_for_a_3d_unet():

    from trainrun.algorithms.channels_last import ChannelsLast
    from trainrun.core.events import Event
    from trainrun.models.build import build_model

    config = validate(compose(["task=segmentation", "data=synthetic_brats", "model=unet3d", *PATCH_3D]), files=False)
    config.model.unet.filters = [4, 8, 8]
    config.model.unet.strides = [1, 2, 2]
    state = SimpleNamespace(model=build_model(config.model))
    ChannelsLast().apply(Event.INIT, state)
    assert state.memory_format is torch.channels_last_3d
    weight = next(p for p in state.model.parameters() if p.dim() == 5)
    assert weight.is_contiguous(memory_format=torch.channels_last_3d)


# ------------------------------------------------------------------------------ runs
@pytest.mark.slow
def test_a_tiny_unet_trains_on_the_synthetic_set_and_logs_each_classs_dice(tmp_path):
    result = run_here(
        *TINY_SEG, "max_duration=4ep", "data.segmentation.samples_per_volume=4", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr
    records = read_metrics(tmp_path)
    assert len(records) == 4 and {"dice", "dice_1", "dice_2", "dice_3", "eval_loss"} <= set(records[-1])
    assert records[-1]["dice"] == pytest.approx(
        (records[-1]["dice_1"] + records[-1]["dice_2"] + records[-1]["dice_3"]) / 3
    )
    assert records[-1]["dice"] > records[0]["dice"]  # it learns
    assert "mean Dice" in result.stdout


@pytest.mark.slow
def test_two_gloo_ranks_train_the_one_rank_unet_with_micro_batches_of_a_ranks_share(tmp_path):
    """The batch Dice is taken over each rank's share (as under DDP in Composer and nnU-Net): with
    one crop per rank, one process reproduces it with micro-batches of one crop (the sampler deals
    the step's crops to ranks in turn); instance norm keeps no running statistics. The two then
    agree to float summation order."""
    from trainrun.core.checkpoint import list_checkpoints

    args = [*TINY_SEG, "model.unet.norm=instance", "train_batch_size=2", "max_duration=6ba", "eval_interval=6ba"]
    runs = {"one": ["device_train_microbatch_size=1"], "two": ["launcher.devices=2"]}
    for name, extra in runs.items():
        result = run_here(*args, *extra, f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr
    first, other = (read_metrics(tmp_path / name) for name in runs)
    for key in ("train_loss", "eval_loss", "dice"):
        assert other[-1][key] == pytest.approx(first[-1][key], rel=1e-5, abs=1e-6), key
    one, two = (
        torch.load(list_checkpoints(tmp_path / name / "checkpoints")[-1], weights_only=True)["model"] for name in runs
    )
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.slow
def test_a_unet_run_killed_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    """SIGKILL (no handler runs) after the first checkpoint, then resume=auto: the same metrics and,
    with EMA's averaged weights, the same final checkpoint bit for bit."""
    args = [*TINY_SEG, "algorithms=[ema]", "max_duration=60ba", "eval_interval=30ba", "checkpoint.interval=5ba"]
    args += ["checkpoint.keep=20", "data.segmentation.samples_per_volume=8"]  # 64 crops: 8 steps an epoch
    whole, killed, newest = killed_and_resumed(args, tmp_path)
    assert newest < 60 and newest % 8  # a mid-epoch checkpoint
    final = "ep7-ba60.pt"
    a, b = (torch.load(run / "checkpoints" / final, weights_only=True) for run in (whole, killed))
    for key, value in a["model"].items():
        assert torch.equal(b["model"][key], value), key


@pytest.mark.slow
def test_the_cli_trains_brats21_regions_on_a_decathlon_folder_read_from_nifti(tmp_path):
    write_decathlon_folder(tmp_path / "Task01_BrainTumour", cases=5, values=(0, 1, 2, 4))
    args = [TINY_SEG[0], "data=decathlon", f"data.path={tmp_path / 'Task01_BrainTumour'}", "max_duration=2ba"]
    args += [
        *TINY_SEG[2:],
        "eval_interval=2ba",
        "data.segmentation.samples_per_volume=4",
        "data.segmentation.regions=[[1,2,3],[1,3],[3]]",
        "model.num_classes=3",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    result = run_here(*args)
    assert result.returncode == 0, result.stderr
    (record,) = read_metrics(tmp_path / "run")
    assert 0 <= record["dice"] <= 1 and record["batch"] == 2
    assert record["dice"] == pytest.approx((record["dice_1"] + record["dice_2"] + record["dice_3"]) / 3)
    assert len(list((tmp_path / "cache").glob("decathlon-*/BRATS_*_image.npy"))) == 5


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda root: (root / "dataset.json").write_text("{not json"), r"dataset.json' is not valid JSON \(line 1"),
        (
            lambda root: (root / "dataset.json").write_text(json.dumps({"labels": {}, "training": []})),
            r"dataset.json' has no 'modality' object \(the Decathlon layout\)$",
        ),
        (
            lambda root: (root / "dataset.json").write_text(
                json.dumps({"modality": {}, "labels": {}, "training": [{"image": "a.nii.gz"}]})
            ),
            r"dataset.json' training case 1 needs an 'image' and a 'label' path$",
        ),
        (
            lambda root: (root / "imagesTr" / "BRATS_001.nii.gz").write_bytes(b"not a gzip file"),
            r"BRATS_001.nii.gz' is not a readable NIfTI image \(",
        ),
        (
            lambda root: (root / "labelsTr" / "BRATS_002.nii.gz").write_bytes(gzip.compress(b"not NIfTI")),
            r"BRATS_002.nii.gz' is not a readable NIfTI image \(",
        ),
    ],
)
def test_a_damaged_decathlon_folder_is_one_line_naming_the_file(tmp_path, damage, message):
    root = tmp_path / "Task01_BrainTumour"
    write_decathlon_folder(root)
    damage(root)
    config = DataConfig(name="decathlon", path=str(root), cache_dir=str(tmp_path / "c"))
    with pytest.raises(TrainrunError, match=message):
        store_path(config)


def test_the_configured_foreground_oversampling_reaches_the_training_crops(tmp_path):
    """Set through the config, not handed to the crop rule by the test: at 1.0 every crop of small
    patches holds tumour, at 0.0 (uniform placement) few do."""
    from trainrun.config import check
    from trainrun.data.interface import datasets

    small = [*TINY_SEG, "data.segmentation.patch_size=[8,8]", "data.segmentation.synthetic_shape=[8,48,48]"]
    small += ["data.segmentation.augment=false", "data.segmentation.samples_per_volume=8", f"data.cache_dir={tmp_path}"]
    holding_tumour = {}
    for rate in (0.0, 1.0):
        config = check([*small, f"data.segmentation.foreground_oversampling={rate}"], files=False)[0]
        train = datasets(config.data).train
        holding_tumour[rate] = sum(bool((train[i][1] > 0).any()) for i in range(len(train))) / len(train)
    assert holding_tumour[1.0] == 1.0 and holding_tumour[0.0] < 0.5


# ------------------------------------------------------------------------------ preparing a task folder
def store_files(path):
    return {file.name: file.read_bytes() for file in sorted(path.iterdir()) if file.suffix in (".npy", ".json")}


@pytest.mark.slow
def test_cases_prepared_in_worker_processes_give_the_bytes_of_one_process(tmp_path, capsys):
    from trainrun.data.decathlon import write_decathlon

    write_decathlon_folder(tmp_path / "task", cases=4)
    write_decathlon(tmp_path / "task", tmp_path / "serial")
    write_decathlon(tmp_path / "task", tmp_path / "parallel", workers=2)
    assert store_files(tmp_path / "serial") == store_files(tmp_path / "parallel")
    assert len(store_files(tmp_path / "serial")) == 4 * 3 + 1
    out = capsys.readouterr().out
    assert "preparing 4 of 4 cases of" in out and "prepared: 4/4 cases" in out


def test_a_killed_preparation_continues_with_the_cases_it_lacks_to_the_same_store(tmp_path, capsys):
    from trainrun.data.decathlon import write_decathlon

    write_decathlon_folder(tmp_path / "task", cases=4)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    write_decathlon(tmp_path / "task", whole)
    write_decathlon(tmp_path / "task", killed)
    # what a kill during the third case leaves: two cases whole, the third's image, a temporary file, no index
    (killed / "index.json").unlink()
    for file in killed.glob("BRATS_003_*"):
        file.unlink()
    (killed / "BRATS_002_label.npy").unlink()
    (killed / "BRATS_002_locations.npy").unlink()
    (killed / ".BRATS_002_label.npy.tmp999").write_bytes(b"half")
    kept = {file.name: file.stat().st_mtime_ns for file in killed.glob("BRATS_00[01]_*")}
    capsys.readouterr()
    write_decathlon(tmp_path / "task", killed)
    assert "preparing 2 of 4 cases" in capsys.readouterr().out and "(2 kept from an earlier preparation)"
    assert {file.name: file.stat().st_mtime_ns for file in killed.glob("BRATS_00[01]_*")} == kept
    assert store_files(killed) == store_files(whole)


def test_cases_of_another_spacing_are_resampled_to_the_median_spacing(tmp_path):
    import nibabel

    from trainrun.data.decathlon import write_decathlon

    arrays = write_decathlon_folder(tmp_path / "task", cases=3)
    image, label = arrays["BRATS_001"]
    coarse = np.diag([2.0, 2.0, 2.0, 1.0])  # one case at 2 mm, the others at 1 mm: the median is 1 mm
    nibabel.save(nibabel.Nifti1Image(image, coarse), tmp_path / "task" / "imagesTr" / "BRATS_001.nii.gz")
    nibabel.save(nibabel.Nifti1Image(label, coarse), tmp_path / "task" / "labelsTr" / "BRATS_001.nii.gz")
    write_decathlon(tmp_path / "task", tmp_path / "store")
    store = VolumeStore.open(tmp_path / "store")
    assert json.loads((tmp_path / "store" / "index.json").read_text())["spacing"] == [1.0, 1.0, 1.0]
    assert store.label(0).shape == (4, 8, 6) and store.label(1).shape == (8, 16, 12)  # the box, twice as fine
    assert set(np.unique(store.label(1)).tolist()) == {0, 2}  # labels stay labels (each one's indicator's arg-max)
    assert (store.label(1) == 2).sum() == pytest.approx(8 * (label == 2).sum(), rel=0.5)


@pytest.mark.slow
def test_a_fold_sweep_trains_each_fold_reports_them_as_one_entry_and_ensembles_them(tmp_path):
    """``trainrun sweep folds=all``, then ``trainrun ensemble`` on a held-out Decathlon folder: the
    ensemble's per-case Dice is that of the runs' averaged probabilities, computed here by hand."""
    out = tmp_path / "cv"
    args = ["sweep", *TINY_SEG, "data.segmentation.folds=2", "folds=all", "max_duration=1ep", f"out={out}"]
    args += [f"data.cache_dir={tmp_path / 'cache'}", "name=unet_cv"]
    result = run_here(*args)  # the sweep here, each fold's run in its own process
    assert result.returncode == 0, result.stderr
    runs = sorted(out.glob("ssr1-fold*"))
    assert [run.name for run in runs] == ["ssr1-fold0", "ssr1-fold1"]
    assert json.loads((out / "sweep.json").read_text())["folds"] == [0, 1]
    assert [read_metrics(run)[-1]["dice"] for run in runs]  # each fold evaluated on its held-out cases
    assert all((run / "model.pt").is_file() for run in runs)
    report = (out / "report.csv").read_text().splitlines()
    (entry,) = report[1:]  # the folds are one entry: their mean, spread and range
    assert entry.startswith("unet_cv,1,1,2,"), report  # budget 1, 1 epoch, 2 folds
    write_decathlon_folder(tmp_path / "heldout", cases=3)
    ensembled = run_here("ensemble", str(out), "--data", str(tmp_path / "heldout"))  # its output is what is tested
    assert ensembled.returncode == 0, ensembled.stderr
    assert "ensemble" in ensembled.stdout and "mean Dice on 3 held-out cases" in ensembled.stdout
    scores = json.loads((out / "ensemble.json").read_text())
    assert set(scores["cases"]) == {"ssr1-fold0", "ssr1-fold1", "ensemble"}
    # the ensemble by hand for the first case: the two folds' logits averaged, its arg-max scored
    from trainrun.commands.ensemble import run_config
    from trainrun.data.segmentation import store_path
    from trainrun.run import model_holding

    configs = [run_config(run) for run in runs]
    assert [config.data.segmentation.fold for config in configs] == [0, 1]  # each run validates its own fold
    data = DataConfig(**{**vars(configs[0].data), "name": "decathlon", "path": str(tmp_path / "heldout")})
    store = VolumeStore.open(store_path(data))
    task = Segmentation(data)
    volume, label = torch.from_numpy(store.image(0).astype("float32")), torch.from_numpy(store.label(0).astype("int64"))
    total = 0
    for run, config in zip(runs, configs, strict=True):
        model = model_holding(config, None, torch.load(run / "model.pt", weights_only=True)).eval()
        with torch.inference_mode():
            total = total + task.predict(model, [volume])[0]
    by_hand = volume_dice(total / 2, label)
    assert scores["cases"]["ensemble"][0] == pytest.approx(by_hand.tolist(), abs=1e-6)
    bad = run_here("ensemble", str(tmp_path / "heldout"), "--data", str(tmp_path / "heldout"))
    assert bad.returncode == 2 and "is not a run: no summary.json in it or under it" in bad.stderr
    manifest = json.loads((tmp_path / "heldout" / "dataset.json").read_text())
    manifest["modality"] = {"0": "CT", "1": "PET"}  # cases of another number of channels than the models take
    (tmp_path / "heldout" / "dataset.json").write_text(json.dumps(manifest))
    unfit = run_here("ensemble", str(out), "--data", str(tmp_path / "heldout"))
    assert unfit.returncode == 2 and len(unfit.stderr.splitlines()) == 1, unfit.stderr
    assert "bad value for 'model.unet.in_channels': 4, but '" in unfit.stderr
    assert "dataset.json' names 2 channel(s) (CT, PET)" in unfit.stderr


def test_the_ensemble_averages_the_runs_logits_as_nnunets_predictor_averages_its_folds():
    """Two runs that disagree, crafted so that the rules differ: voxel 0, the mean of the logits picks
    class 1 where the mean probability would pick 2; voxel 1, the single most confident run picks 0
    where the mean of the logits picks 1. Through the one path ``predict`` writes and ``ensemble``
    scores (:meth:`Segmenter.ensembled`, each run's model predicting the case as a run's would): the
    ensemble is nnU-Net v2's rule for the folds it is given, the mean of the logits, by value; each
    run is shown its own once (the rule held against nnU-Net's code: tests/test_nnunet_agreement.py)."""
    from pathlib import Path

    from trainrun.commands.ensemble import Segmenter
    from trainrun.tasks.whole_cases import PreparedCase

    task = Segmentation(DataConfig(name="synthetic_brats"))
    first = torch.tensor([[2.0, 3.0, -3.0], [0.9, 0.1, 1e-4]])  # per voxel: logits, then probabilities
    second = torch.tensor([[-2.0, -2.0, 1.0], [1e-4, 0.85, 0.15]])
    first[1], second[1] = first[1].log(), second[1].log()

    def model(logits: torch.Tensor) -> torch.nn.Module:
        """A 1 x 1 convolution whose logits are ``logits[0]`` at intensity 1 and ``logits[1]`` at -1."""
        convolution = torch.nn.Conv2d(1, 3, 1)
        with torch.no_grad():
            convolution.weight.copy_(((logits[0] - logits[1]) / 2).reshape(3, 1, 1, 1))
            convolution.bias.copy_((logits[0] + logits[1]) / 2)
        return convolution.eval()

    runs = [Path("fold_0"), Path("fold_1")]
    segmenter = Segmenter(runs, [model(first), model(second)], task, None, 1, torch.device("cpu"))
    grid = (1.0, 1.0, 1.0)
    case = PreparedCase(torch.tensor([1.0, -1.0]).reshape(1, 1, 1, 2), (), (1, 1, 2), (1, 1, 2), grid, grid)
    seen: list[tuple[str, torch.Tensor]] = []
    ensembled = segmenter.ensembled(case, lambda run, logits: seen.append((run.name, logits.clone())))
    each = [logits.T.reshape(3, 1, 1, 2) for logits in (first, second)]  # (classes, D, H, W)
    assert [name for name, _ in seen] == ["fold_0", "fold_1"]
    for (_, shown), expected in zip(seen, each, strict=True):
        torch.testing.assert_close(shown, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ensembled, (each[0] + each[1]) / 2, atol=1e-6, rtol=1e-5)  # by value, every class
    assert ensembled.argmax(0).flatten().tolist() == [1, 1]
    probabilities = torch.stack(each).softmax(1)
    assert probabilities.mean(0).argmax(0).flatten().tolist() == [2, 1]  # the mean probability
    assert probabilities.amax(0).argmax(0).flatten().tolist() == [2, 0]  # the most confident


def test_a_loader_process_keeps_a_bounded_number_of_cases_open(tmp_path, monkeypatch):
    """Crops of 300 cases read with room for 80 more file descriptors than the process holds: a
    loader worker keeps only the ``OPEN_CASES`` last read mapped (two descriptors each), not one
    image and label per case (600)."""
    import resource

    from trainrun.data import segmentation
    from trainrun.data.volume_store import VolumeStore

    names = [f"case_{index:03d}" for index in range(300)]
    for name in names:
        np.save(tmp_path / f"{name}_image.npy", np.random.default_rng(0).random((1, 4, 6, 6), dtype=np.float32))
        np.save(tmp_path / f"{name}_label.npy", np.ones((4, 6, 6), dtype=np.uint8))
        np.save(tmp_path / f"{name}_locations.npy", np.array([[1, 0, 0, 0], [1, 2, 3, 3]], dtype=np.int32))
    store = VolumeStore(tmp_path, tuple(names), ("CT",), ("background", "organ"))
    config = SegmentationDataConfig(patch_size=[4, 4, 4], samples_per_volume=2)
    patches = segmentation.Patches(store, list(range(300)), config, augmented=False)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 80, hard))
    try:
        crops = [patches[index] for index in np.random.default_rng(1).permutation(len(patches))]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(crops) == 600 and crops[0][0].shape == (1, 4, 4, 4)
    assert len(patches.opened) == segmentation.OPEN_CASES
