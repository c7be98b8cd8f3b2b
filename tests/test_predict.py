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

from trainrun.data.decathlon import image_cases
from trainrun.data.resampling import IMAGE_ORDER, resampled_channels, separate_axis

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
    # by hand: crop, z-score over the body (cropping left 61 %), every other slice (16 -> 8 at 3 mm),
    # the model, each slice twice back
    from trainrun.commands.ensemble import run_config
    from trainrun.run import model_holding
    from trainrun.tasks.segmentation import Segmentation, volume_dice

    config = run_config(trained / "run")
    model = model_holding(config, None, torch.load(trained / "run" / "model.pt", weights_only=True)).eval()
    volume = torch.from_numpy(image.transpose(2, 1, 0))[None]  # (C, z, y, x)
    box = (slice(1, 15), slice(2, 22), slice(2, 22))
    cropped = volume[(slice(None), *box)]
    body = cropped != 0
    cropped = torch.where(body, (cropped - cropped[body].mean()) / cropped[body].std(unbiased=False), 0.0)
    coarse = cropped[:, 1::2]  # nearest: slice floor((i + 0.5) * 14 / 7)
    task = Segmentation(config.data)
    with torch.inference_mode():
        (logits,) = task.predict(model, [coarse])
    fine = logits[:, torch.arange(14) // 2]  # back: slice floor((i + 0.5) * 7 / 14)
    whole = torch.zeros(16, 24, 24, dtype=torch.long)
    whole[box] = fine.argmax(0)
    truth = torch.from_numpy(np.select([label == 1, label == 4], [1, 2], 0).transpose(2, 1, 0))
    by_hand = volume_dice(torch.nn.functional.one_hot(whole, 3).movedim(-1, 0).float(), truth)
    scores = json.loads((out / "dice.json").read_text())
    assert scores["cases"]["new_001"] == pytest.approx(by_hand.tolist(), abs=1e-6)
    assert np.array_equal(predicted, np.choose(whole.numpy(), [0, 1, 4]).transpose(2, 1, 0).astype(np.uint8))


@pytest.mark.slow
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


def bad_folder(tmp_path, name: str, images: dict, labels: dict | None = None):
    """A folder ``name`` of NIfTI images (file name: array), and a ``labelsTs/`` beside them where given."""
    folder = tmp_path / name / ("imagesTs" if labels else "")
    folder.mkdir(parents=True)
    for file, array in images.items():
        nibabel.save(nibabel.Nifti1Image(array, np.eye(4)), folder / file)
    for file, array in (labels or {}).items():
        (tmp_path / name / "labelsTs").mkdir(exist_ok=True)
        nibabel.save(nibabel.Nifti1Image(array, np.eye(4)), tmp_path / name / "labelsTs" / file)
    return tmp_path / name


BAD_FOLDERS = {  # a folder predict cannot segment: its files, and the refusal's words
    "empty": ({}, None, "holds no NIfTI image"),
    "two channels, the model takes one": (
        {"x.nii.gz": np.stack([case(1, 8)[0]] * 2, axis=-1)},
        None,
        "x.nii.gz' has 2 channel(s); the runs' models take 1",
    ),
    "a 2-D image": (
        {"x.nii.gz": case(1, 8)[0][:, :, 0]},
        None,
        "x.nii.gz' is a 2-D image (24 x 24); cases are volumes",
    ),
    "a 5-D image": (
        {"x.nii.gz": case(1, 8)[0][..., None, None]},
        None,
        "x.nii.gz' is a 5-D image (24 x 24 x 8 x 1 x 1)",
    ),
    "a label of another size": (
        {"x.nii.gz": case(1, 8)[0]},
        {"x.nii.gz": case(1, 6)[1]},
        "x.nii.gz' is 24 x 24 x 6, its image",
    ),
    "a good case, then a bad one": (
        {"a.nii.gz": case(1, 8)[0], "b.nii.gz": case(2, 8)[0][:, :, :1, None, None]},
        None,
        "b.nii.gz' is a 5-D image",
    ),
}


@pytest.mark.parametrize("name", BAD_FOLDERS)
def test_a_folder_predict_cannot_segment_is_one_line_and_nothing_is_written(trained, tmp_path, name):
    """Every case's files are checked from their headers before ``--out`` is made: the first that
    cannot be segmented is one line naming it, exit 2, and no folder is left behind."""
    images, labels, words = BAD_FOLDERS[name]
    folder = bad_folder(tmp_path, "data", images, labels)
    result = run_here("predict", str(trained / "run"), "--data", str(folder), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert words in result.stderr
    assert not (tmp_path / "out").exists()


def test_every_run_given_is_a_finished_segmentation_run_of_one_task(trained, trained_run, tmp_path):
    """``predict`` and ``ensemble`` take every run found under the folders given, or refuse in one
    line naming the run: one of another task (an image classifier), one that has not finished (no
    model.pt: leaving it out would change the ensemble), one that trained on another task folder."""
    import shutil

    unfinished, elsewhere = tmp_path / "unfinished", tmp_path / "elsewhere"
    for copy in (unfinished, elsewhere):  # other runs: their summaries differ (a copy of the same run is one run)
        shutil.copytree(trained / "run", copy)
        summary = json.loads((copy / "summary.json").read_text())
        (copy / "summary.json").write_text(json.dumps({**summary, "seed": copy.name}))
    (unfinished / "model.pt").unlink()
    config = (elsewhere / "config.yaml").read_text()
    (elsewhere / "config.yaml").write_text(config.replace(str(trained / "train"), str(tmp_path / "other_task")))
    data = trained / "train"
    refusals = {
        "an image run": (trained_run, f"'{trained_run}' trained task image_classification; predict needs segmentation"),
        "an unfinished run": (unfinished, f"'{unfinished}' has no model.pt"),
        "a run of another task": (elsewhere, f"'{elsewhere}' trained on data=decathlon '{tmp_path / 'other_task'}'"),
    }
    for run, words in refusals.values():
        result = run_here("predict", str(trained / "run"), str(run), "--data", str(data), "--out", str(tmp_path / "o"))
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("trainrun: error: bad value for 'RUNS': ") and words in result.stderr
        assert not (tmp_path / "o").exists()
        out = tmp_path / "e.json"
        result = run_here("ensemble", str(trained / "run"), str(run), "--data", str(data), "--out", str(out))
        assert result.returncode == 2 and words.replace("predict needs", "ensemble needs") in result.stderr
        assert not out.exists()


def test_cases_group_nnunet_channel_files_only_where_every_case_has_them_all(tmp_path):
    for name in ("a_0000", "a_0001", "b_0000", "b_0001", ".hidden_0000"):
        (tmp_path / f"{name}.nii.gz").touch()
    assert [(name, [f.name for f in files]) for name, files, _ in image_cases(tmp_path, 2)] == [
        ("a", ["a_0000.nii.gz", "a_0001.nii.gz"]),
        ("b", ["b_0000.nii.gz", "b_0001.nii.gz"]),
    ]
    # one channel and case numbers of four digits: each file its own case
    assert [name for name, _, _ in image_cases(tmp_path, 1)] == ["a_0000", "a_0001", "b_0000", "b_0001"]


def test_a_low_resolution_axis_is_resampled_apart_by_nearest_neighbour_as_nnunet_chooses_it():
    """nnU-Net's separate z: the case's coarse axis, else the target's; none where two axes share the
    coarsest side; across it slices are repeated or dropped, never blended (the agreement with
    nnU-Net's own code on whole cases: tests/test_nnunet_agreement.py)."""
    assert separate_axis((3.0, 0.8, 0.8), (3.0, 0.8, 0.8)) == 0
    assert separate_axis((1.5, 0.8, 0.8), (3.0, 0.8, 0.8)) == 0  # the target's, where the case is not
    assert separate_axis((0.8, 3.0, 0.8), (3.0, 0.8, 0.8)) == 1  # the case's first
    assert separate_axis((1.0, 1.0, 1.0), (2.0, 1.0, 1.0)) is None
    assert separate_axis((0.24, 1.25, 1.25), (0.24, 1.25, 1.25)) is None  # two coarse axes: resampled in 3D
    volume = np.arange(2 * 4 * 3 * 2, dtype=np.float32).reshape(2, 4, 3, 2)
    nearest = resampled_channels(volume, (8, 3, 2), 0, IMAGE_ORDER)
    assert np.allclose(nearest, volume[:, np.arange(8) // 2], atol=1e-5) and nearest.dtype == np.float32
    assert resampled_channels(volume, (4, 3, 2), 0, IMAGE_ORDER) is volume


def test_nested_regions_paint_their_own_class_outermost_first():
    """BraTS21's regions (whole tumour {1,2,3}, core {1,3}, enhancing {3}) become classes 2, 1 and 3
    as nnU-Net's ``regions_class_order`` paints them; regions that are not nested are one line."""
    from trainrun.errors import DataError
    from trainrun.tasks.whole_cases import region_classes

    member = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 1, 0]], dtype=torch.bool)  # (R, voxels)
    assert region_classes(member, [[1, 2, 3], [1, 3], [3]]).tolist() == [2, 1, 3, 0]
    with pytest.raises(DataError, match=r"region \[1, 2\] has no class of its own"):
        region_classes(member[:2], [[1, 2], [1, 2]])
