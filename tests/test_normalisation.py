"""Each channel of a Decathlon task normalised as nnU-Net normalises its modality: CT by the training
set's foreground intensities (clipped to their 0.5 and 99.5 percentiles, scaled by their mean and
standard deviation, every voxel kept, 0 HU included), MRI per case, over its body where cropping
removed a quarter of the image or more, else over the whole box (the exact agreement with nnU-Net's
own code: tests/test_nnunet_agreement.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write_decathlon_task

from trainrun.data.segmentation import store_path
from trainrun.data.volume_store import VolumeStore, normalisation
from trainrun.errors import DataError
from trainrun.schema import DataConfig


def write_ct_task(root, cases: int = 3, voxel_mm: float = 1.0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A Decathlon-layout task of a CT channel (air at -1,000 HU, soft tissue around 0 with voxels at
    exactly 0 HU, a brighter organ) and an MRI channel; its arrays in NIfTI's (x, y, z, channel)."""
    rng = np.random.default_rng(0)
    arrays = {}
    for index in range(cases):
        ct = np.full((12, 10, 8), -1000.0, np.float32)
        ct[1:11, 1:9, 1:7] = rng.normal(20, 40, (10, 8, 6)).round()
        ct[2:5, 2:4, 2:4] = 0.0  # water-dense tissue at exactly 0 HU
        label = np.zeros((12, 10, 8), np.uint8)
        label[6:10, 4:8, 2:6] = 1
        ct[label == 1] = rng.normal(150 + 20 * index, 30, int(label.sum())).round()
        ct[6, 4, 2] = 3000.0  # a metal voxel: beyond the 99.5th percentile, clipped
        mri = np.where(ct > -1000, rng.uniform(0.5, 2.0, ct.shape), 0.0).astype(np.float32)
        arrays[f"CT_{index:03d}"] = np.stack([ct, mri], axis=-1), label
    modality, labels = {"0": "CT", "1": "T2"}, {"0": "background", "1": "organ"}
    write_decathlon_task(root, "Liver-like", arrays, modality, labels, voxel_mm)
    return arrays


@pytest.mark.parametrize(
    ("name", "scheme"),
    [
        ("CT", "ct"),
        ("ct", "ct"),
        ("noNorm", "none"),
        ("rescale_to_0_1", "rescale"),
        ("FLAIR", "zscore"),
        ("T2", "zscore"),
    ],
)
def test_a_channels_name_chooses_its_normalisation_as_nnunet_does(name, scheme):
    assert normalisation(name) == scheme


def test_ct_is_clipped_and_scaled_by_the_training_sets_foreground_and_keeps_0_hu(tmp_path):
    arrays = write_ct_task(tmp_path / "Task03_Liver")
    config = DataConfig(name="decathlon", path=str(tmp_path / "Task03_Liver"), cache_dir=str(tmp_path / "c"))
    store = VolumeStore.open(store_path(config))
    foreground = np.concatenate([image[..., 0][label > 0] for image, label in arrays.values()])  # all: < 10,000
    lower, upper = np.percentile(foreground, [0.5, 99.5])
    mean, std = foreground.mean(), foreground.std()
    index = json.loads((store.path / "index.json").read_text())
    assert index["normalisation"]["schemes"] == ["ct", "zscore"]
    stats = index["normalisation"]["ct"]["0"]
    drawn = [stats["lower"], stats["upper"], stats["mean"], stats["std"]]  # 10^8 draws with replacement
    np.testing.assert_allclose(drawn[2:], [mean, std], rtol=2e-3)
    assert foreground.min() <= drawn[0] <= np.percentile(foreground, 2)  # each case weighs alike
    assert drawn[1] == upper == 3000  # the metal voxel
    for case, name in enumerate(store.cases):
        image, _ = arrays[name]
        ct = image[..., 0].transpose(2, 1, 0)  # (z, y, x): the store's axial slices first
        lower, upper, mean, std = drawn
        expected = (np.clip(ct, lower, upper) - mean) / std
        np.testing.assert_allclose(store.image(case)[0].astype(np.float32), expected, atol=4e-3, rtol=2e-3)
        zero = ct == 0
        at_zero = (np.clip(0.0, lower, upper) - mean) / std  # tissue like any other, not set to 0 as background
        assert zero.any() and at_zero != 0 and np.allclose(store.image(case)[0][zero], at_zero, atol=4e-3)
        mri = image[..., 1].transpose(2, 1, 0)  # the CT's air is not 0: no cropping, no mask, zeros z-scored too
        z_scored = (mri - mri.mean()) / mri.std()
        np.testing.assert_allclose(store.image(case)[1].astype(np.float32), z_scored, atol=4e-3, rtol=2e-3)


def write_nnunet_v2_task(root, arrays: dict, channels: dict[str, str], labels: dict[str, int]) -> None:
    """nnU-Net v2's raw layout of ``arrays``: a file a channel (``CASE_0000.nii.gz``), labels by name."""
    import nibabel

    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    for name, (image, label) in arrays.items():
        for channel in range(image.shape[-1]):
            nibabel.save(
                nibabel.Nifti1Image(image[..., channel], np.eye(4)), root / "imagesTr" / f"{name}_{channel:04d}.nii.gz"
            )
        nibabel.save(nibabel.Nifti1Image(label, np.eye(4)), root / "labelsTr" / f"{name}.nii.gz")
    manifest = {"channel_names": channels, "labels": labels, "numTraining": len(arrays), "file_ending": ".nii.gz"}
    (root / "dataset.json").write_text(json.dumps(manifest))


def test_an_nnunet_v2_raw_folder_is_read_as_the_same_cases_as_the_decathlon_layout(tmp_path):
    arrays = write_ct_task(tmp_path / "Task03_Liver")
    write_nnunet_v2_task(tmp_path / "Dataset003_Liver", arrays, {"0": "CT", "1": "T2"}, {"background": 0, "organ": 1})
    stores = [
        VolumeStore.open(
            store_path(DataConfig(name="decathlon", path=str(tmp_path / task), cache_dir=str(tmp_path / "c")))
        )
        for task in ("Task03_Liver", "Dataset003_Liver")
    ]
    decathlon, nnunet = stores
    assert (
        nnunet.cases == decathlon.cases and nnunet.channels == ("CT", "T2") and nnunet.labels == ("background", "organ")
    )
    for case in range(len(decathlon.cases)):
        assert np.array_equal(nnunet.image(case), decathlon.image(case))
        assert np.array_equal(nnunet.label(case), decathlon.label(case))
    regions = tmp_path / "regions"
    write_nnunet_v2_task(
        regions, dict(list(arrays.items())[:2]), {"0": "CT", "1": "T2"}, {"background": 0, "organ": [1]}
    )
    with pytest.raises(DataError, match=r"labels must give each name one integer value"):
        store_path(DataConfig(name="decathlon", path=str(regions), cache_dir=str(tmp_path / "c")))


NNUNET_TRAINING = ["task=segmentation", "data=decathlon", "model=unet2d", "max_duration=1ba"]


def test_an_nnunet_v2_folder_with_a_channel_file_its_channel_names_do_not_list_is_refused(tmp_path):
    """Two channel files a case (``_0000``, ``_0001``) and one name: training on one channel of two would
    be silent; trainrun refuses in one line naming the unlisted files, before anything is written."""
    from conftest import run_here

    arrays = write_ct_task(tmp_path / "Task03_Liver")
    task = tmp_path / "Dataset003_Liver"
    write_nnunet_v2_task(task, arrays, {"0": "CT"}, {"background": 0, "organ": 1})
    cache, run = tmp_path / "cache", tmp_path / "run"
    result = run_here(*NNUNET_TRAINING, f"data.path={task}", f"data.cache_dir={cache}", f"hydra.run.dir={run}")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "channel_names lists 1 channel(s) (0000)" in line and "CT_000_0001.nii.gz" in line, line
    assert not any(cache.rglob("*.npy")) and not (run / "metrics.jsonl").exists()


def test_a_training_case_whose_channel_files_differ_in_size_is_refused_naming_the_file_and_both_sizes(tmp_path):
    import nibabel
    from conftest import run_here

    arrays = write_ct_task(tmp_path / "Task03_Liver")
    task = tmp_path / "Dataset003_Liver"
    write_nnunet_v2_task(task, arrays, {"0": "CT", "1": "T2"}, {"background": 0, "organ": 1})
    smaller = task / "imagesTr" / "CT_001_0001.nii.gz"
    nibabel.save(nibabel.Nifti1Image(np.zeros((12, 10, 7), np.float32), np.eye(4)), smaller)
    cache, run = tmp_path / "cache", tmp_path / "run"
    result = run_here(*NNUNET_TRAINING, f"data.path={task}", f"data.cache_dir={cache}", f"hydra.run.dir={run}")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert str(smaller) in line and "12 x 10 x 7" in line and "12 x 10 x 8" in line, line
    assert not any(cache.rglob("*.npy"))


def test_held_out_cases_are_prepared_at_the_training_stores_spacing_and_ct_statistics(tmp_path):
    """``trainrun ensemble`` and ``trainrun predict`` prepare a held-out case as the model saw its
    training cases: at the training store's voxel spacing, CT scaled by the training set's statistics."""
    from trainrun.commands.ensemble import training_reference
    from trainrun.tasks.whole_cases import Preparation, prepared

    write_ct_task(tmp_path / "train")
    write_ct_task(tmp_path / "held", cases=2, voxel_mm=2.0)  # coarser voxels, another foreground
    train = DataConfig(name="decathlon", path=str(tmp_path / "train"), cache_dir=str(tmp_path / "c"))
    held = DataConfig(name="decathlon", path=str(tmp_path / "held"), cache_dir=str(tmp_path / "c"))
    reference = training_reference(train)
    preparation = Preparation.of(reference, None, classes=2)
    own = VolumeStore.open(store_path(held))  # the folder alone: its own spacing and statistics
    alone = json.loads((own.path / "index.json").read_text())
    assert preparation.ct[0] == reference["normalisation"]["ct"]["0"] != alone["normalisation"]["ct"]["0"]
    assert list(preparation.spacing) == reference["spacing"] == [1.0, 1.0, 1.0] and alone["spacing"] == [2.0] * 3
    case = prepared((tmp_path / "held" / "imagesTr" / "CT_000.nii.gz",), preparation)
    assert case.volume.shape[1] == 2 * own.label(0).shape[0]  # resampled to 1 mm: twice the slices
    stats = preparation.ct[0]  # the metal voxel clipped at the training set's 99.5th percentile
    assert float(case.volume[0].max()) <= (stats["upper"] - stats["mean"]) / stats["std"] + 1e-2
    synthetic = DataConfig(name="synthetic_brats", cache_dir=str(tmp_path / "c"))
    assert training_reference(synthetic) is None  # a built-in set has no folder to follow


def test_a_task_folder_sets_the_models_channels_and_the_classes_as_its_dataset_json_names_them(tmp_path):
    """``data=decathlon data.path=TASK`` takes ``model.unet.in_channels`` and ``data.num_classes``
    from dataset.json, as nnU-Net does (the config printed and written has them); one set otherwise on
    the command line is one line naming both, exit 2, before anything runs."""
    import yaml
    from conftest import run_here

    write_ct_task(tmp_path / "Task03_Liver")  # CT and T2; background and organ
    args = ["task=segmentation", "data=decathlon", "model=unet2d", f"data.path={tmp_path / 'Task03_Liver'}"]
    shown = run_here("--cfg", "job", *args)
    assert shown.returncode == 0, shown.stderr
    job = yaml.safe_load(shown.stdout)
    assert job["model"]["unet"]["in_channels"] == 2 and job["data"]["num_classes"] == 2
    assert job["model"]["num_classes"] == "${data.num_classes}"
    refused = run_here(*args, "model.unet.in_channels=4", f"hydra.run.dir={tmp_path / 'run'}")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "bad value for 'model.unet.in_channels': 4, but '" in refused.stderr
    assert "dataset.json' names 2 channel(s) (CT, T2)" in refused.stderr and not (tmp_path / "run").exists()
    again = run_here("--cfg", "job", *args, "data.num_classes=2", "model.unet.in_channels=2")  # the same: taken
    assert again.returncode == 0, again.stderr
