"""trainrun's segmentation preparation and export held against nnU-Net v2's own code (the installed
``nnunetv2``: its fingerprint extractor, experiment planner, default preprocessor, predictor and
export), fed the same generated cases in nnU-Net v2's raw layout:

- CT (a channel after an MRI-like one, so that the intensity draws run through every channel's
  stream) with metal and voxels at exactly 0 HU, in-plane 0.7-0.9 mm and 2.5-5 mm slices that differ
  between cases (anisotropic and thin: the target's slice spacing is the 10th percentile; cubic
  in-plane, nearest across slices), air around the body (no cropping: MRI z-scored over every voxel);
- MRI of two channels with a zero hole inside the body, zeros that reach its edge, and zeros around
  it (cropping leaves under 75 %: z-scored over the body, the hole filled and included, the zeros at
  the edge not), spacings near 1 mm that differ between cases (resampled in 3D), and BraTS-like
  nested regions; and MRI whose body reaches the volume's faces (cropping leaves all of it: every
  voxel z-scored, zeros included).

Crop boxes, target spacing and shapes, CT statistics, normalised intensities (within float16's
rounding: the store keeps float16), labels after resampling, predictions brought back from the same
logits and an ensemble of two folds' models are compared; every one agrees.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from multiprocessing.pool import ThreadPool
from pathlib import Path

import nibabel
import numpy as np
import pytest
import torch

from trainrun.data import fingerprint
from trainrun.data.decathlon import read_image, write_decathlon
from trainrun.data.fingerprint import body_box, body_mask
from trainrun.data.volume_store import VolumeStore
from trainrun.schema import DataConfig, SegmentationDataConfig
from trainrun.tasks.segmentation import Segmentation
from trainrun.tasks.whole_cases import Preparation, class_map, prepared

_FOLDERS = tempfile.mkdtemp(prefix="trainrun-nnunet-")  # nnU-Net reads its folders once, at import
atexit.register(shutil.rmtree, _FOLDERS, ignore_errors=True)
for _variable in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
    os.environ[_variable] = os.path.join(_FOLDERS, _variable)
    os.makedirs(os.environ[_variable])

SAMPLES = 60_000  # the foreground intensities drawn in all (nnU-Net's 10^8, on both sides alike)
REGIONS = [[1, 2, 3], [2, 3], [3]]  # BraTS's whole tumour, core, enhancing


def write_raw(name: str, cases: dict, channels: dict[str, str], labels: dict) -> Path:
    """nnU-Net v2's raw layout of ``cases`` (name: (channel arrays, label, voxel mm), NIfTI's x, y, z)."""
    root = Path(os.environ["nnUNet_raw"]) / name
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    for case, (images, label, voxel) in cases.items():
        affine = np.diag([*voxel, 1.0])
        for channel, image in enumerate(images):
            nibabel.save(nibabel.Nifti1Image(image, affine), root / "imagesTr" / f"{case}_{channel:04d}.nii.gz")
        nibabel.save(nibabel.Nifti1Image(label, affine), root / "labelsTr" / f"{case}.nii.gz")
    manifest = {"channel_names": channels, "labels": labels, "numTraining": len(cases), "file_ending": ".nii.gz"}
    (root / "dataset.json").write_text(json.dumps(manifest))
    return root


def ct_cases() -> dict:
    """Five CT cases: air, a body of soft tissue with a 0 HU pocket, an organ, a tumour and metal."""
    rng = np.random.default_rng(1)
    cases = {}
    for index, voxel in enumerate(
        [(0.8, 0.8, 3.0), (0.7, 0.7, 2.5), (0.9, 0.9, 4.0), (0.8, 0.8, 5.0), (0.75, 0.75, 3.5)]
    ):
        shape = (40, 36, 8 + index)
        x, y, z = np.meshgrid(*(np.linspace(-1, 1, side) for side in shape), indexing="ij")
        body = (x / 0.9) ** 2 + (y / 0.8) ** 2 < 1
        ct = np.where(body, rng.normal(40, 30, shape).round(), -1000.0).astype(np.float32)
        ct[14:18, 10:13, 2:4] = 0.0  # water-dense tissue at exactly 0 HU
        label = np.zeros(shape, np.uint8)
        label[((x - 0.2) / 0.4) ** 2 + (y / 0.35) ** 2 + ((z - 0.1) / 0.8) ** 2 < 1] = 1
        label[((x - 0.25) / 0.15) ** 2 + (y / 0.15) ** 2 + (z / 0.5) ** 2 < 1] = 2
        ct[label == 1] = rng.normal(120 + 10 * index, 25, int((label == 1).sum())).round()
        ct[label == 2] = rng.normal(60, 15, int((label == 2).sum())).round()
        ct[20, 18, 3] = 3000.0  # metal
        mri = np.where(body, rng.uniform(0.5, 2.0, shape), 0.0).astype(np.float32)
        cases[f"ct_{index:03d}"] = ([mri, ct], label, voxel)
    return cases


def mri_cases(extent: tuple[float, float, float] = (0.6, 0.65, 0.6), cases: int = 4) -> dict:
    """MRI cases of two channels: a brain (an ellipsoid of ``extent`` in a volume of side 2) with zeros
    inside it, nested tumour labels 1-3. At the default extent cropping to the body leaves under 75 %
    of the volume; a brain that reaches the volume's faces leaves all of it."""
    rng = np.random.default_rng(2)
    found = {}
    for index, voxel in enumerate([(1.0, 1.0, 1.0), (1.2, 1.2, 1.5), (0.9, 0.9, 1.1), (1.1, 1.0, 1.3)][:cases]):
        shape = (30, 28, 24 + index)
        x, y, z = np.meshgrid(*(np.linspace(-1, 1, side) for side in shape), indexing="ij")
        brain = (x / extent[0]) ** 2 + (y / extent[1]) ** 2 + (z / extent[2]) ** 2 < 1
        label = np.zeros(shape, np.uint8)
        label[brain & (((x - 0.1) / 0.3) ** 2 + (y / 0.3) ** 2 + (z / 0.3) ** 2 < 1)] = 1
        label[((x - 0.1) / 0.18) ** 2 + (y / 0.2) ** 2 + (z / 0.2) ** 2 < 1] = 2
        label[((x - 0.1) / 0.08) ** 2 + (y / 0.1) ** 2 + (z / 0.1) ** 2 < 1] = 3
        channels = [
            np.where(brain, rng.gamma(4, 0.2 + 0.05 * c, shape) + 0.3 * label, 0).astype(np.float32) for c in (1, 2)
        ]
        for image in channels:
            image[12:16, 6:10, 10:13] = 0.0  # zeros in every channel that reach the brain's edge: not a hole
            image[8:11, 12:15, 10:13] = 0.0  # a hole of 27 voxels inside the brain: filled, in the body's mask
        found[f"mri_{index:03d}"] = (channels, label, voxel)
    return found


ENCLOSED_HOLE = (slice(8, 11), slice(12, 15), slice(10, 13))  # NIfTI's (x, y, z), as mri_cases makes it


@pytest.fixture(scope="module")
def ct(tmp_path_factory):
    return both_sides("Dataset901_CT", ct_cases(), {"0": "T2", "1": "CT"}, tmp_path_factory)


@pytest.fixture(scope="module")
def mri(tmp_path_factory):
    return both_sides("Dataset902_MRI", mri_cases(), {"0": "T2", "1": "ADC"}, tmp_path_factory)


@pytest.fixture(scope="module")
def mri_uncropped(tmp_path_factory):
    """A brain reaching the volume's faces: cropping leaves all of it, so every voxel is z-scored."""
    cases = mri_cases(extent=(1.05, 1.05, 1.1), cases=3)
    return both_sides("Dataset903_MRI", cases, {"0": "T2", "1": "ADC"}, tmp_path_factory)


def both_sides(name: str, cases: dict, channels: dict, tmp_path_factory) -> dict:
    """The task prepared by nnU-Net (fingerprint, 3d_fullres plan, preprocessing of every case) and by
    trainrun (its volume store), the same number of intensities drawn on each side."""
    from nnunetv2.experiment_planning.dataset_fingerprint.fingerprint_extractor import DatasetFingerprintExtractor
    from nnunetv2.experiment_planning.experiment_planners.default_experiment_planner import ExperimentPlanner
    from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    labels = {
        "background": 0,
        **{f"class {value}": value for value in range(1, 1 + max(int(c[1].max()) for c in cases.values()))},
    }
    raw = write_raw(name, cases, channels, labels)
    import nnunetv2.utilities.utils

    with pytest.MonkeyPatch.context() as patch:  # nnU-Net lists files in a forked pool: threads, in a test's process
        patch.setattr(nnunetv2.utilities.utils, "Pool", ThreadPool)
        extractor = DatasetFingerprintExtractor(name, num_processes=1)
        extractor.num_foreground_voxels_for_intensitystats = SAMPLES
        extractor.run()
        ExperimentPlanner(name).plan_experiment()
    plans = PlansManager(str(Path(os.environ["nnUNet_preprocessed"]) / name / "nnUNetPlans.json"))
    configuration = plans.get_configuration("3d_fullres")
    described = json.loads((raw / "dataset.json").read_text())
    preprocessor = DefaultPreprocessor(verbose=False)
    theirs = {}
    for case in sorted(cases):
        images = [str(raw / "imagesTr" / f"{case}_{channel:04d}.nii.gz") for channel in range(len(channels))]
        data, seg, properties = preprocessor.run_case(
            images, str(raw / "labelsTr" / f"{case}.nii.gz"), plans, configuration, described
        )
        theirs[case] = (images, data, seg, properties)
    store_folder = tmp_path_factory.mktemp(name) / "store"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fingerprint, "FOREGROUND_VOXELS", SAMPLES)
        write_decathlon(raw, store_folder)
    index = json.loads((store_folder / "index.json").read_text())
    return {"plans": plans, "configuration": configuration, "described": described, "theirs": theirs,
            "store": VolumeStore.open(store_folder), "index": index, "classes": len(labels)}  # fmt: skip


def float16_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    """``ours`` (float16) is ``theirs`` (float32) to within float16's rounding of it."""
    rounding = np.spacing(np.abs(theirs).astype(np.float16)).astype(np.float32) / 2
    assert np.all(np.abs(ours.astype(np.float32) - theirs) <= rounding * (1 + 1e-3)), np.abs(ours - theirs).max()


@pytest.mark.parametrize("task", ["ct", "mri", "mri_uncropped"])
def test_the_store_is_nnunets_preprocessing_of_the_same_folder(task, request):
    side = request.getfixturevalue(task)
    configuration, store, index = side["configuration"], side["store"], side["index"]
    assert index["spacing"] == pytest.approx(list(configuration.spacing), abs=1e-12)
    if task == "ct":  # anisotropic and thin: the slices' 10th percentile, not their median (3.5 mm)
        assert index["spacing"][0] == pytest.approx(np.percentile([3.0, 2.5, 4.0, 5.0, 3.5], 10))
    schemes = {"ct": "CTNormalization", "zscore": "ZScoreNormalization"}
    assert [schemes[scheme] for scheme in index["normalisation"]["schemes"]] == configuration.normalization_schemes
    masked = [index["normalisation"]["mask"] and scheme == "zscore" for scheme in index["normalisation"]["schemes"]]
    assert masked == configuration.use_mask_for_norm and index["normalisation"]["mask"] == (task == "mri")
    for channel, stats in index["normalisation"]["ct"].items():
        expected = side["plans"].foreground_intensity_properties_per_channel[channel]
        ours = [stats[key] for key in ("lower", "upper", "mean", "std")]
        np.testing.assert_allclose(
            ours, [expected[key] for key in ("percentile_00_5", "percentile_99_5", "mean", "std")], rtol=1e-6
        )
    for number, case in enumerate(store.cases):
        images, data, seg, properties = side["theirs"][case]
        image = read_image(tuple(Path(image) for image in images))
        mask = body_mask(image)
        if task.startswith("mri"):  # (z, y, x): the enclosed zeros are a hole the body's mask fills
            hole = mask[tuple(reversed(ENCLOSED_HOLE))]
            assert hole.size == 27 and hole.all() and not image[(slice(None), *reversed(ENCLOSED_HOLE))].any()
        box = body_box(mask)
        assert [[side.start, side.stop] for side in box] == [
            list(map(int, bounds)) for bounds in properties["bbox_used_for_cropping"]
        ]
        assert store.image(number).shape == data.shape
        float16_close(store.image(number), data)
        assert np.array_equal(store.label(number), np.where(seg[0] < 0, 0, seg[0]))


def export_both(
    side: dict, logits: np.ndarray, case: str, regions: list | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A case's label map from the same ``logits`` on its training grid, exported by nnU-Net and by trainrun."""
    from nnunetv2.inference.export_prediction import convert_predicted_logits_to_segmentation_with_correct_shape

    described = side["described"]
    if regions:
        described = {**described, "labels": {"background": 0, "whole": [1, 2, 3], "core": [2, 3], "enhancing": 3},
                     "regions_class_order": [1, 2, 3]}  # fmt: skip
    images, _, _, properties = side["theirs"][case]
    labels = side["plans"].get_label_manager(described)
    theirs = convert_predicted_logits_to_segmentation_with_correct_shape(
        torch.from_numpy(logits), side["plans"], side["configuration"], labels, properties, num_threads_torch=1
    )
    ours = class_map(segmentation_task(side, regions), torch.from_numpy(logits), prepared_case(side, images))
    return ours.numpy(), np.asarray(theirs)


def segmentation_task(side: dict, regions: list | None = None) -> Segmentation:
    settings = SegmentationDataConfig(patch_size=[16, 16, 16], mirror_axes=[], regions=regions or [])
    return Segmentation(DataConfig(name="decathlon", num_classes=side["classes"], segmentation=settings))


def prepared_case(side: dict, images: list[str]):
    preparation = Preparation.of(side["index"], None, side["classes"])
    return prepared(tuple(Path(image) for image in images), preparation)


@pytest.mark.parametrize("task", ["ct", "mri"])
def test_a_case_is_prepared_for_prediction_and_brought_back_from_logits_as_nnunet_does(task, request):
    side = request.getfixturevalue(task)
    from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor

    case = side["store"].cases[1]
    images = side["theirs"][case][0]
    data, _, _ = DefaultPreprocessor(verbose=False).run_case(
        images, None, side["plans"], side["configuration"], side["described"]
    )
    ours = prepared_case(side, images)
    np.testing.assert_array_equal(ours.volume.numpy(), data)
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, (side["classes"], *data.shape[1:])).astype(np.float32)
    logits[1] += 0.8  # a class that wins often enough to have boundaries
    mine, theirs = export_both(side, logits, case)
    assert mine.shape == theirs.shape == tuple(side["theirs"][case][3]["shape_before_cropping"])
    assert np.array_equal(mine, theirs) and len(np.unique(mine)) == side["classes"]
    if task == "mri":  # regions: each one's sigmoid over 0.5, painted outermost first
        region_logits = rng.normal(0, 2, (3, *data.shape[1:])).astype(np.float32)
        mine, theirs = export_both(side, region_logits, case, REGIONS)
        assert np.array_equal(mine, theirs) and set(np.unique(mine).tolist()) == {0, 1, 2, 3}


def test_an_ensemble_of_two_folds_is_nnunets_predictor_given_both(mri):
    """Two folds' models (a pointwise convolution each, so that windows and padding change nothing)
    through trainrun's ensemble and through nnU-Net's predictor holding both folds' weights (its
    windows unweighted, one window here): both take the mean of the folds' logits (nnU-Net's is the
    mean of its single folds' to the bit), equal to within the float16 in which nnU-Net sums
    windows and folds (trainrun sums in float32), so the same class wherever two classes are not
    within that rounding; and the same label map from the same averaged logits."""
    from nnunetv2.inference.export_prediction import convert_predicted_logits_to_segmentation_with_correct_shape
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    from trainrun.commands.ensemble import Segmenter

    classes, channels = mri["classes"], 2
    folds = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        folds.append(torch.nn.Conv3d(channels, classes, 1).eval())
    case = mri["store"].cases[2]
    images, _, _, properties = mri["theirs"][case]
    task, ours = segmentation_task(mri), prepared_case(mri, images)
    segmenter = Segmenter([Path("fold_0"), Path("fold_1")], folds, task, None, channels, torch.device("cpu"))
    shown = []
    with torch.inference_mode():
        mine = segmenter.ensembled(ours, lambda run, logits: shown.append(logits.clone()))

    def nnunet(states: list[dict]) -> torch.Tensor:
        predictor = nnUNetPredictor(
            use_gaussian=False, use_mirroring=False, device=torch.device("cpu"), allow_tqdm=False
        )
        network = torch.nn.Conv3d(channels, classes, 1).eval()
        predictor.manual_initialization(network, mri["plans"], mri["configuration"], states, mri["described"], "", None)
        with torch.inference_mode():
            return predictor.predict_logits_from_preprocessed_data(ours.volume.clone())

    first, second, theirs = (
        nnunet(states)
        for states in ([folds[0].state_dict()], [folds[1].state_dict()], [fold.state_dict() for fold in folds])
    )
    assert torch.equal(theirs, (first + second) / 2) and torch.equal(mine, (shown[0] + shown[1]) / 2)
    ulp = sum(np.spacing(np.abs(logits.numpy())).astype(np.float32) for logits in (first, second, theirs))
    assert np.all(np.abs(mine.numpy() - theirs.float().numpy()) <= ulp)  # float16's roundings of the three
    top = theirs.float().topk(2, dim=0).values
    clear = (top[0] - top[1]).numpy() > 2 * ulp.max(0)
    assert clear.mean() > 0.95 and np.array_equal(mine.argmax(0).numpy()[clear], theirs.argmax(0).numpy()[clear])
    labels = mri["plans"].get_label_manager(mri["described"])
    exported = convert_predicted_logits_to_segmentation_with_correct_shape(
        theirs.float(), mri["plans"], mri["configuration"], labels, properties, num_threads_torch=1
    )
    brought_back = class_map(task, theirs.float(), ours).numpy()
    assert np.array_equal(brought_back, np.asarray(exported)) and len(np.unique(brought_back)) > 1
