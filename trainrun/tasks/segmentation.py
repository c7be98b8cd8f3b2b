"""Segmentation: a class per voxel (or nested regions); Dice + cross-entropy (Dice + BCE); the mean
Dice over foreground classes (regions) as quality (higher is better).

Training batches are crops ``(images (N, C, *patch) float32, labels (N, *patch) int64)`` from
:mod:`trainrun.data.segmentation`; the loss is Composer's BraTS loss, MONAI's soft Dice over the
foreground classes (softmax, the batch as one region) plus cross-entropy, in fp32. Evaluation
reads whole volumes: 2D models predict each axial slice, 3D models slide windows of the training
patch over the volume with half their side as overlap and Gaussian weights (nnU-Net's inference,
MONAI's ``sliding_window_inference``); a slice or volume smaller than the patch is padded to it.
The Dice of each foreground class is taken per volume from the arg-max prediction, 1 when
prediction and label are both empty and 0 when only one is (the BraTS rule), then averaged over
volumes (summed over ranks) and over classes into ``dice``; ``dice_<k>`` keeps each class's.
With ``data.segmentation.regions`` (BraTS21's whole tumour, tumour core and enhancing tumour) the
model has a sigmoid output per region, the loss sums each region's Dice + BCE, and the Dice is each
region's (logit above 0) by the same rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainrun import run_files
from trainrun.atomic_io import atomic_write
from trainrun.core.state import State
from trainrun.schema import DataConfig, TrainConfig
from trainrun.tasks.base import Evaluator, LossFunction, Task

SLIDING_WINDOW_OVERLAP = 0.5  # nnU-Net's inference
# data.segmentation.window_batch when unset: nnU-Net's one 3D window a pass, Composer's 2D chunks of 64 slices
WINDOWS_PER_PASS = {2: 64, 3: 1}


def deep_supervision_weights(outputs: int) -> list[float]:
    """The loss weights of the full-resolution output and each lower one: halving per level,
    normalised to sum to 1 (nnU-Net's)."""
    weights = [0.5**level for level in range(outputs)]
    return [weight / sum(weights) for weight in weights]


class DeepSupervision:
    """``loss`` over the outputs of every decoder level: MONAI's DynUNet stacks them on axis 1 in
    training, each upsampled to the input's size (so each is compared with the full-size labels,
    where nnU-Net downsamples the labels instead), weighted by :func:`deep_supervision_weights`."""

    def __init__(self, loss: LossFunction) -> None:
        self.loss = loss

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.dim() == labels.dim() + 1:  # one output (evaluation)
            return self.loss(logits, labels)
        weights = deep_supervision_weights(logits.shape[1])
        return sum(weight * self.loss(logits[:, level], labels) for level, weight in enumerate(weights))


Predictor = Callable[[torch.Tensor], torch.Tensor]


def mirrored(predict: Predictor, dims: list[int]) -> Predictor:
    """``predict`` averaged over every combination of flips of ``dims`` (test-time mirroring: the
    logits of each flipped input flipped back, nnU-Net's)."""
    if not dims:
        return predict
    flips = [list(chosen) for count in range(len(dims) + 1) for chosen in itertools.combinations(dims, count)]

    def run(windows: torch.Tensor) -> torch.Tensor:
        total = predict(windows).float()
        for flip in flips[1:]:
            total += predict(windows.flip(flip)).float().flip(flip)
        return total / len(flips)

    return run


def without_small_enhancing(logits: torch.Tensor, min_voxels: int, regions: bool) -> torch.Tensor:
    """BraTS post-processing: where the predicted enhancing tumour (the last region, or the last class
    where it is the arg-max) has fewer than ``min_voxels`` voxels, none is predicted: the region's
    logits are set below 0, or the class's to its lowest so that each voxel takes its next class."""
    predicted = logits[-1] > 0 if regions else logits.argmax(0) == logits.shape[0] - 1
    if min_voxels == 0 or int(predicted.sum()) >= min_voxels:
        return logits
    logits = logits.clone()
    logits[-1] = torch.finfo(logits.dtype).min
    return logits


class DiceCrossEntropy:
    """MONAI's soft Dice (foreground classes, softmax, over the whole batch) plus cross-entropy."""

    def __init__(self) -> None:
        from monai.losses import DiceLoss

        self.dice = DiceLoss(include_background=False, softmax=True, to_onehot_y=True, batch=True)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        return self.dice(logits, labels.unsqueeze(1)) + F.cross_entropy(logits, labels)


def region_masks(labels: torch.Tensor, regions: list[list[int]]) -> torch.Tensor:
    """(N, R, *spatial) float masks: voxel in region r when its label is one of ``regions[r]``."""
    return torch.stack([torch.isin(labels, labels.new_tensor(region)) for region in regions], 1).float()


class RegionDiceBCE:
    """BraTS21's loss for nested regions (NVIDIA's nnU-Net): summed over the regions, MONAI's soft
    Dice of the sigmoid over the whole batch plus binary cross-entropy."""

    def __init__(self, regions: list[list[int]]) -> None:
        from monai.losses import DiceLoss

        self.regions, self.dice = regions, DiceLoss(sigmoid=True, batch=True)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits, masks = logits.float(), region_masks(labels, self.regions)
        return sum(
            self.dice(logits[:, [r]], masks[:, [r]]) + F.binary_cross_entropy_with_logits(logits[:, r], masks[:, r])
            for r in range(len(self.regions))
        )


def volume_dice(logits: torch.Tensor, label: torch.Tensor, regions: list[list[int]] | None = None) -> torch.Tensor:
    """The Dice of each foreground class (the arg-max of ``logits`` (K, *spatial)) or, given
    ``regions``, of each region (logits above 0) against ``label`` (*spatial): 1 where both are
    empty, 0 where one is (MONAI's ``ignore_empty=False``)."""
    from monai.metrics import compute_dice

    if regions:
        predicted, truth = (logits > 0)[None].float(), region_masks(label[None], regions)
        return compute_dice(predicted, truth, include_background=True, ignore_empty=False)[0]
    classes = logits.shape[0]
    predicted = F.one_hot(logits.argmax(0), classes).movedim(-1, 0)[None]
    truth = F.one_hot(label, classes).movedim(-1, 0)[None]
    return compute_dice(predicted, truth, include_background=False, ignore_empty=False)[0]


class DiceEvaluator(Evaluator):
    def __init__(self, task: Segmentation, device: torch.device, world_size: int) -> None:
        self.task, self.world_size = task, world_size
        self.sums = torch.zeros(task.scored + 2, dtype=torch.float64, device=device)  # Dice each, loss, volumes

    def update(self, outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        for logits, label in zip(outputs, targets, strict=True):
            self.sums[-2] += self.task.loss_function(logits[None], label[None])
            self.sums[:-2] += self.task.volume_dice(logits, label)
            self.sums[-1] += 1

    def compute(self) -> dict[str, float]:
        if self.world_size > 1:
            dist.all_reduce(self.sums)
        means = (self.sums[:-1] / self.sums[-1]).tolist()
        each = {f"dice_{k}": value for k, value in enumerate(means[:-1], start=1)}
        return {"dice": sum(means[:-1]) / len(each), **each, "eval_loss": means[-1]}


class Segmentation(Task):
    name = "segmentation"
    metrics = {"dice": "mean Dice"}
    unit = "patch"

    def __init__(self, data: DataConfig | None = None) -> None:
        data = data or DataConfig()
        settings = data.segmentation
        self.patch = list(settings.patch_size)
        self.regions = [list(region) for region in settings.regions]
        self.loss_function = RegionDiceBCE(self.regions) if self.regions else DiceCrossEntropy()
        self.training_loss = DeepSupervision(self.loss_function)
        self.window_batch = settings.window_batch or WINDOWS_PER_PASS[len(self.patch)]
        self.blend_on_host = settings.blend_device == "cpu"
        self.mirror_axes = [axis for axis in settings.mirror_axes if len(self.patch) == 3 or axis > 0]
        self.enhancing_min_voxels = settings.enhancing_min_voxels
        self.scored = len(self.regions) or data.num_classes - 1  # regions, or foreground classes
        # each one's Dice is logged and shown beside the mean
        self.metrics = {"dice": "mean Dice", **{f"dice_{k}": f"Dice {k}" for k in range(1, self.scored + 1)}}

    def batch(self, batch: Any, state: State) -> tuple[Any, Any, int]:
        if not isinstance(batch[0], torch.Tensor):  # (image, label) pairs of whole volumes, for evaluation
            moved = [(image.to(state.device), label.to(state.device)) for image, label in batch]
            return [image for image, _ in moved], [label for _, label in moved], len(moved)
        images, labels = batch
        images = images.to(state.device, non_blocking=True).contiguous(memory_format=state.memory_format)
        return images, labels.to(state.device, non_blocking=True), len(labels)

    def example_batch(self, config: TrainConfig, size: int, text: None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` training crops (``data.segmentation.patch_size``) of ``model.unet.in_channels``
        channels and their labels, as the loader gives them (values arbitrary: what trainrun estimate runs)."""
        images = torch.zeros(size, config.model.unet.in_channels, *self.patch)
        return images, torch.randint(config.data.num_classes, (size, *self.patch))

    def windows_a_case(self, shape: list[int]) -> int:
        """Forward passes of one window each that :meth:`predict` runs on a case of ``shape`` (D, H, W):
        MONAI's sliding windows at :data:`SLIDING_WINDOW_OVERLAP` (each axial slice's, in 2D), each
        mirrored along every combination of ``mirror_axes``."""
        spatial = shape[-len(self.patch) :]
        slices = shape[0] if len(self.patch) == 2 else 1
        windows = 1
        for side, patch in zip(spatial, self.patch, strict=True):
            step = max(1, int(patch * (1 - SLIDING_WINDOW_OVERLAP)))
            windows *= 1 if side <= patch else math.ceil((side - patch) / step) + 1
        return slices * windows * 2 ** len(self.mirror_axes)

    def predict(self, model: nn.Module, inputs: Any) -> Any:
        """Logits (K, D, H, W) of each whole volume: slice by slice (2D) or by sliding windows (3D),
        ``window_batch`` windows a pass, each mirrored along ``mirror_axes`` (volume axes; a 2D
        model's slice has the volume's height and width as its axes 0 and 1)."""
        if isinstance(inputs, torch.Tensor):
            return model(inputs)
        from monai.inferers import sliding_window_inference

        predictor = mirrored(model, [axis + (2 if len(self.patch) == 3 else 1) for axis in self.mirror_axes])

        def infer(images: torch.Tensor) -> torch.Tensor:
            return sliding_window_inference(
                images, self.patch, self.window_batch, predictor, overlap=SLIDING_WINDOW_OVERLAP, mode="gaussian",
                sw_device=images.device, device="cpu" if self.blend_on_host else images.device,
            ).float()  # fmt: skip

        if len(self.patch) == 2:  # the volume's axial slices as a batch of images
            return [infer(volume.movedim(1, 0)).movedim(0, 1) for volume in inputs]
        return [infer(volume[None])[0] for volume in inputs]

    def loss(self, name: str) -> LossFunction:
        return self.training_loss

    def fake_tensor_loss(self, name: str) -> LossFunction:
        """The training loss as ``trainrun estimate``'s fake tensors run it: its cross-entropy terms
        alone, under deep supervision (MONAI's Dice reads its reduction axes back from a tensor, which
        a fake tensor cannot give; its memory and FLOPs are the logits' size, small beside the network's)."""
        if self.regions:
            regions = self.regions

            def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
                return F.binary_cross_entropy_with_logits(logits.float(), region_masks(labels, regions))

            return DeepSupervision(cross_entropy)
        return DeepSupervision(lambda logits, labels: F.cross_entropy(logits.float(), labels))

    def evaluator(self, state: State) -> DiceEvaluator:
        return DiceEvaluator(self, state.device, state.world_size)

    def export(self, state: State, run_dir: Path) -> list[str]:
        """``<run>/model.pt``: the weights the final evaluation scored, for ``trainrun ensemble``."""
        path = run_dir / run_files.MODEL
        atomic_write(path, lambda handle: torch.save(state.raw_model.state_dict(), handle))
        return [f"wrote {path} (the final weights, for trainrun ensemble)"]

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Each class's probability (softmax over axis 0), or each region's (sigmoid)."""
        return logits.sigmoid() if self.regions else logits.softmax(0)

    def volume_dice(self, logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Each foreground class's (region's) Dice of one volume, after the post-processing."""
        logits = without_small_enhancing(logits, self.enhancing_min_voxels, bool(self.regions))
        return volume_dice(logits, label, self.regions)


def build(data: DataConfig | None = None) -> Segmentation:
    return Segmentation(data)
