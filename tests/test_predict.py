"""``trainrun predict``: label maps of a folder's images in each input's own geometry (an anisotropic
case resampled as by hand and back), the task's label values, nnU-Net v2 channel files, a kill
mid-way continued; and the resampling rules themselves."""

from __future__ import annotations

import json
import signal

import nibabel
import numpy as np
import pytest
import torch
from conftest import read_metrics, run_here, start_cli, wait_for, write_decathlon_task

from trainrun.data.decathlon import image_cases, low_resolution_axis, resampled_volume

UNET = ["task=segmentation", "data=decathlon", "model=unet2d", "model.unet.filters=[8,16,32]"]
UNET += ["model.unet.strides=[1,2,2]", "data.segmentation.patch_size=[16,16]", "progress=false"]
UNET += ["train_batch_size=8", "eval_batch_size=2", "optimizer=radam", "optimizer.lr=3e-3", "scheduler=constant"]
UNET += ["model.unet.in_channels=1", "model.num_classes=3", "data.num_classes=3"]
UNET += ["data.segmentation.samples_per_volume=4"]
VALUES = {"0": "background", "1": "kidney", "4": "tumour"}  # label values 0, 1 and 4: classes 0, 1, 2


def case(seed: int, slices: int) -> tuple[np.ndarray, np.ndarray]:
    """An image (NIfTI's x, y, z) whose classes show in its intensities, and its label values."""
    rng = np.random.default_rng(seed)
    image, label = np.zeros((24, 24, slices), np.float32), np.zeros((24, 24, slices), np.uint8)
    image[2:22, 2:22, 1:-1] = rng.uniform(0.5, 1.0, (20, 20, slices - 2))
    label[6:14, 8:16, 2 : slices // 2] = 1
    label[14:19, 6:18, slices // 3 : -2] = 4
    image[label == 1] += 2.0
    image[label == 4] += 4.0
    return image, label


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny 2D UNet trained on cases of 0.8 x 0.8 x 3 mm voxels (its store's spacing: 3, 0.8, 0.8)."""
    root = tmp_path_factory.mktemp("predict")
    arrays = {f"case_{index:03d}": case(index, 8) for index in range(5)}
    write_decathlon_task(root / "train", "Kidney", arrays, {"0": "T2"}, VALUES, voxel_mm=(0.8, 0.8, 3.0))
    args = [*UNET, f"data.path={root / 'train'}", "max_duration=6ba", "eval_interval=6ba"]
    result = run_here(*args, f"data.cache_dir={root / 'cache'}", f"hydra.run.dir={root / 'run'}")
    assert result.returncode == 0, result.stderr
    assert read_metrics(root / "run")
    return root


def test_an_anisotropic_case_is_predicted_back_onto_its_own_grid_as_by_hand(trained, tmp_path):
    """A case of 0.8 x 0.8 x 1.5 mm voxels, 16 slices: prepared at the training spacing (8 slices,
    nearest across slices as nnU-Net's separate z), segmented, brought back to 16 slices and its box:
    the file has the input's shape, affine and zooms, the task's label values, and its Dice is the
    Dice of the same steps done here by hand."""
    image, label = case(9, 16)
    write_decathlon_task(tmp_path / "new", "Kidney", {"new_001": (image, label)}, {"0": "T2"}, VALUES,
                         voxel_mm=(0.8, 0.8, 1.5), images="imagesTs")  # fmt: skip
    out = tmp_path / "out"
    result = run_here("predict", str(trained / "run"), "--data", str(tmp_path / "new"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "mean Dice on 1 labelled case(s)" in result.stdout
    written = nibabel.load(out / "new_001.nii.gz")
    source = nibabel.load(tmp_path / "new" / "imagesTs" / "new_001.nii.gz")
    assert written.shape == (24, 24, 16) and np.allclose(written.affine, source.affine)
    assert written.header.get_zooms() == pytest.approx((0.8, 0.8, 1.5))
    predicted = np.asarray(written.dataobj)
    assert set(np.unique(predicted).tolist()) <= {0, 1, 4} and predicted.dtype == np.uint8
    # by hand: crop, z-score, every other slice (16 -> 8 at 3 mm), the model, each slice twice back
    from trainrun.commands.ensemble import run_config
    from trainrun.run import model_holding
    from trainrun.tasks.segmentation import Segmentation, volume_dice

    config = run_config(trained / "run")
    model = model_holding(config, None, torch.load(trained / "run" / "model.pt", weights_only=True)).eval()
    volume = torch.from_numpy(image.transpose(2, 0, 1))[None]  # (C, D, H, W)
    box = (slice(1, 15), slice(2, 22), slice(2, 22))
    cropped = volume[(slice(None), *box)]
    body = cropped != 0
    cropped = torch.where(body, (cropped - cropped[body].mean()) / cropped[body].std(unbiased=False), 0.0)
    cropped = cropped.half().float()
    coarse = cropped[:, 1::2]  # nearest: slice floor((i + 0.5) * 14 / 7)
    task = Segmentation(config.data)
    with torch.inference_mode():
        (logits,) = task.predict(model, [coarse])
    fine = logits.softmax(0)[:, torch.arange(14) // 2]  # back: slice floor((i + 0.5) * 7 / 14)
    whole = torch.zeros(16, 24, 24, dtype=torch.long)
    whole[box] = fine.argmax(0)
    truth = torch.from_numpy(np.select([label == 1, label == 4], [1, 2], 0).transpose(2, 0, 1))
    by_hand = volume_dice(torch.nn.functional.one_hot(whole, 3).movedim(-1, 0).float(), truth)
    scores = json.loads((out / "dice.json").read_text())
    assert scores["cases"]["new_001"] == pytest.approx(by_hand.tolist(), abs=1e-6)
    assert np.array_equal(predicted, np.choose(whole.numpy(), [0, 1, 4]).transpose(1, 2, 0).astype(np.uint8))


def test_a_folder_of_channel_files_without_labels_is_segmented_and_a_killed_predict_continues(trained, tmp_path):
    """nnU-Net v2's ``CASE_0000.nii.gz`` files in a plain folder, no labels: one readable label map
    per case; killed after its first file, the same command writes only the missing ones."""
    folder = tmp_path / "images"
    folder.mkdir()
    for index in range(40):
        image, _ = case(100 + index, 8)
        nibabel.save(nibabel.Nifti1Image(image, np.diag([0.8, 0.8, 3.0, 1.0])), folder / f"scan{index:02d}_0000.nii.gz")
    out = tmp_path / "out"
    process = start_cli("predict", str(trained / "run"), "--data", str(folder), "--out", str(out))
    wait_for(lambda: any(out.glob("*.nii.gz")), process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = len(list(out.glob("*.nii.gz")))
    result = run_here("predict", str(trained / "run"), "--data", str(folder), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"segmenting {40 - before} of 40 case(s)" in result.stdout and "Dice" not in result.stdout
    files = sorted(out.iterdir())
    assert [path.name for path in files] == [f"scan{index:02d}.nii.gz" for index in range(40)]  # no leftover
    for path in files:
        assert nibabel.load(path).shape == (24, 24, 8)


def test_bad_folders_are_one_line(trained, tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_here("predict", str(trained / "run"), "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "holds no NIfTI image" in result.stderr
    two = tmp_path / "two"
    two.mkdir()
    image = np.stack([case(1, 8)[0]] * 2, axis=-1)  # two channels; the model takes one
    nibabel.save(nibabel.Nifti1Image(image, np.eye(4)), two / "x.nii.gz")
    result = run_here("predict", str(trained / "run"), "--data", str(two), "--out", str(tmp_path / "o2"))
    assert result.returncode == 2 and "has 2 channel(s); the runs' models take 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cases_group_nnunet_channel_files_only_where_every_case_has_them_all(tmp_path):
    for name in ("a_0000", "a_0001", "b_0000", "b_0001", ".hidden_0000"):
        (tmp_path / f"{name}.nii.gz").touch()
    assert [(name, [f.name for f in files]) for name, files, _ in image_cases(tmp_path, 2)] == [
        ("a", ["a_0000.nii.gz", "a_0001.nii.gz"]),
        ("b", ["b_0000.nii.gz", "b_0001.nii.gz"]),
    ]
    # one channel and case numbers of four digits: each file its own case
    assert [name for name, _, _ in image_cases(tmp_path, 1)] == ["a_0000", "a_0001", "b_0000", "b_0001"]


def test_the_low_resolution_axis_is_resampled_by_nearest_neighbour_the_others_linearly():
    assert low_resolution_axis((3.0, 0.8, 0.8), (3.0, 0.8, 0.8)) == 0
    assert low_resolution_axis((1.5, 0.8, 0.8), (3.0, 0.8, 0.8)) == 0  # the target's, where the case is not
    assert low_resolution_axis((1.0, 1.0, 1.0), (2.0, 1.0, 1.0)) is None
    volume = torch.arange(2 * 4 * 3 * 2, dtype=torch.float32).reshape(2, 4, 3, 2)
    nearest = resampled_volume(volume, (8, 3, 2), axis=0)
    assert torch.equal(nearest, volume[:, torch.arange(8) // 2])  # slices repeated, never blended
    linear = resampled_volume(volume, (4, 6, 4), axis=0)
    expected = torch.nn.functional.interpolate(volume.transpose(0, 1), size=(6, 4), mode="bilinear")
    assert torch.allclose(linear, expected.transpose(0, 1))
    assert resampled_volume(volume, (4, 3, 2), axis=0) is volume


def test_nested_regions_paint_their_own_class_outermost_first():
    """BraTS21's regions (whole tumour {1,2,3}, core {1,3}, enhancing {3}) become classes 2, 1 and 3
    as nnU-Net's ``regions_class_order`` paints them; regions that are not nested are one line."""
    from trainrun.errors import DataError
    from trainrun.tasks.whole_cases import region_classes

    member = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 1, 0]], dtype=torch.bool)  # (R, voxels)
    assert region_classes(member, [[1, 2, 3], [1, 3], [3]]).tolist() == [2, 1, 3, 0]
    with pytest.raises(DataError, match=r"region \[1, 2\] has no class of its own"):
        region_classes(member[:2], [[1, 2], [1, 2]])
