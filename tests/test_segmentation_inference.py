"""nnU-Net's training and inference additions: deep supervision, bounded sliding windows, test-time
mirroring and BraTS post-processing, each checked by numbers."""

from __future__ import annotations

import itertools

import pytest
import torch

from trainrun.config import compose
from trainrun.models.unet import build as build_unet
from trainrun.schema import DataConfig, SegmentationDataConfig
from trainrun.tasks.segmentation import (
    DiceCrossEntropy,
    Segmentation,
    deep_supervision_weights,
    mirrored,
    without_small_enhancing,
)
from trainrun.validation import validate


def tiny_unet(deep_supervision: int) -> torch.nn.Module:
    overrides = ["task=segmentation", "data=synthetic_brats", "model=unet2d", "data.segmentation.patch_size=[16,16]"]
    overrides += ["model.unet.filters=[4,4,4,4]", "model.unet.strides=[1,2,2,2]"]
    config = validate(compose([*overrides, f"model.unet.deep_supervision={deep_supervision}"]), files=False)
    torch.manual_seed(0)
    return build_unet(config.model)


def test_deep_supervision_weighs_each_lower_output_half_the_one_above_normalised_by_hand():
    assert deep_supervision_weights(1) == [1.0]
    assert deep_supervision_weights(3) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    unet = tiny_unet(2).train()
    images, labels = torch.randn(2, 4, 16, 16), torch.randint(0, 4, (2, 16, 16))
    outputs = unet(images)
    assert outputs.shape == (2, 3, 4, 16, 16)  # the output and the two levels below, each at the input's size
    assert not torch.equal(outputs[:, 1], outputs[:, 2])
    task = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[16, 16])))
    each = [DiceCrossEntropy()(outputs[:, level], labels) for level in range(3)]
    by_hand = (4 * each[0] + 2 * each[1] + each[2]) / 7
    torch.testing.assert_close(task.loss("soft_ce")(outputs, labels), by_hand)
    single = tiny_unet(2).eval()(images)  # evaluation: the full-resolution output alone
    assert single.shape == (2, 4, 16, 16)
    torch.testing.assert_close(task.loss("soft_ce")(single, labels), DiceCrossEntropy()(single, labels))


def test_mirroring_averages_the_flipped_predictions_flipped_back_by_hand():
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(2, 3, 3, padding=1).eval()
    windows = torch.randn(2, 2, 6, 5, 4)
    dims = [2, 3, 4]
    combos = [list(c) for n in range(4) for c in itertools.combinations(dims, n)]
    by_hand = sum(conv(windows.flip(c)).flip(c) if c else conv(windows) for c in combos) / 8
    torch.testing.assert_close(mirrored(conv, dims)(windows), by_hand)
    assert mirrored(conv, []) is conv
    task = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8, 8], mirror_axes=[0, 1, 2])))
    volume = torch.randn(2, 8, 8, 8)  # one window: the prediction is the mirrored average itself
    (logits,) = task.predict(conv, [volume])
    torch.testing.assert_close(logits, mirrored(conv, dims)(volume[None])[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits, conv(volume[None])[0], atol=1e-3)
    flat = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8], mirror_axes=[0, 1, 2])))
    conv2d = torch.nn.Conv2d(2, 3, 3, padding=1).eval()
    (logits,) = flat.predict(conv2d, [volume])  # a 2D model flips each slice's height and width only
    for depth in range(8):
        torch.testing.assert_close(logits[:, depth], mirrored(conv2d, [2, 3])(volume[None, :, depth])[0])


def test_the_sliding_window_runs_window_batch_windows_a_pass_and_blends_where_asked():
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(2, 3, 3, padding=1).eval()
    passes = []
    conv.register_forward_hook(lambda module, inputs, output: passes.append(inputs[0].shape[0]))
    volume = torch.randn(2, 20, 16, 8)  # 4 x 3 x 1 windows of 8
    results = {}
    for window_batch in (1, 5):
        settings = SegmentationDataConfig(patch_size=[8, 8, 8], window_batch=window_batch, blend_device="cpu")
        passes.clear()
        (results[window_batch],) = Segmentation(DataConfig(segmentation=settings)).predict(conv, [volume])
        assert max(passes) <= window_batch and sum(passes) == 12
    torch.testing.assert_close(results[1], results[5])
    assert results[1].device.type == "cpu"
    default = Segmentation(DataConfig(segmentation=SegmentationDataConfig(patch_size=[8, 8, 8])))
    assert default.window_batch == 1 and Segmentation(DataConfig()).window_batch == 64  # nnU-Net's, Composer's


@pytest.mark.parametrize("regions", [False, True])
def test_brats_post_processing_removes_an_enhancing_tumour_below_its_threshold_only(regions):
    logits = torch.full((4, 4, 4, 4), -5.0)
    logits[0] = 5.0 if not regions else -5.0  # background everywhere...
    logits[-1, 0, 0, :3] = 10.0  # ...but three voxels of enhancing tumour (the last class or region)
    logits[1, 0, 0, :3] = 6.0 if not regions else 10.0  # each one's next class: the first tumour class
    enhancing = (lambda x: x[-1] > 0) if regions else (lambda x: x.argmax(0) == 3)
    for threshold, kept in ((0, True), (3, True), (4, False)):  # off, at, above the tumour's size
        processed = without_small_enhancing(logits, threshold, regions)
        assert bool(enhancing(processed).any()) == kept
    removed = without_small_enhancing(logits, 4, regions)
    if not regions:
        assert (removed.argmax(0)[0, 0, :3] == 1).all()  # the voxels take their next most likely class
    else:
        assert (removed[1, 0, 0, :3] > 0).all()  # the other regions are kept
    assert torch.equal(logits[-1, 0, 0, 0], torch.tensor(10.0))  # the input is left as it was
