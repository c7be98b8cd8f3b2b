"""Each channel of a Decathlon task normalised as nnU-Net normalises its modality: CT by the training
set's foreground intensities (clipped to their 0.5 and 99.5 percentiles, scaled by their mean and
standard deviation, every voxel kept, 0 HU included), MRI per case over its non-zero voxels."""

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
    np.testing.assert_allclose([stats["lower"], stats["upper"], stats["mean"], stats["std"]], [lower, upper, mean, std])
    for case, name in enumerate(store.cases):
        image, _ = arrays[name]
        ct = image[..., 0].transpose(2, 0, 1)  # (z, x, y): the store's axial slices first
        expected = (np.clip(ct, lower, upper) - mean) / std
        np.testing.assert_allclose(store.image(case)[0].astype(np.float32), expected, atol=4e-3, rtol=2e-3)
        zero = ct == 0
        at_zero = (np.clip(0.0, lower, upper) - mean) / std  # tissue like any other, not set to 0 as background
        assert zero.any() and at_zero != 0 and np.allclose(store.image(case)[0][zero], at_zero, atol=4e-3)
        mri = image[..., 1].transpose(2, 0, 1)
        body = (image != 0).any(axis=-1).transpose(2, 0, 1)  # non-zero in any channel: nnU-Net's mask
        z_scored = np.where(body, (mri - mri[body].mean()) / mri[body].std(), 0.0)
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
