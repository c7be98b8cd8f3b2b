"""Image classification: uint8 images normalised on the device, class labels, top-1 as quality.

Batches are ``(images, labels)`` with images uint8 (N, 3, H, W), on the CPU or already on the
device, whichever loader read them; the task normalises them on the device with ``data.mean`` and
``data.std``, straight into the run's memory format. Evaluation: top-1 and top-5 accuracy
(torchmetrics, synchronised over ranks) and the mean cross-entropy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from trainrun.core.state import State
from trainrun.schema import DataConfig
from trainrun.tasks import Evaluator, LossFunction, Task
from trainrun.tasks.losses import LOSSES


class ClassificationEvaluator(Evaluator):
    def __init__(self, num_classes: int, device: torch.device, world_size: int) -> None:
        # validate_args=False: its checks run torch.unique on every batch, a wait for the device each time
        self.top1 = MulticlassAccuracy(num_classes, top_k=1, average="micro", validate_args=False).to(device)
        top5 = min(5, num_classes)
        self.top5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro", validate_args=False).to(device)
        self.loss = torch.zeros(2, dtype=torch.float64, device=device)  # sum, count
        self.world_size = world_size

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.loss[0] += F.cross_entropy(outputs.float(), targets, reduction="sum")
        self.loss[1] += len(targets)
        self.top1.update(outputs, targets)
        self.top5.update(outputs, targets)

    def compute(self) -> dict[str, float]:
        if self.world_size > 1:
            dist.all_reduce(self.loss)
        return {
            "top1": float(self.top1.compute()),
            "top5": float(self.top5.compute()),
            "eval_loss": float(self.loss[0] / self.loss[1]),
        }


class ImageClassification(Task):
    name = "image_classification"
    quality = "top1"
    metrics = {"top1": "top-1", "top5": "top-5"}
    unit = "img"

    def __init__(self, data: DataConfig | None = None) -> None:
        data = data or DataConfig()
        self.mean = (torch.tensor(data.mean) * 255.0).view(1, 3, 1, 1)  # on the host; a copy follows the images
        self.std = (torch.tensor(data.std) * 255.0).view(1, 3, 1, 1)
        self._device_constants = self.mean, self.std

    def normalise(
        self, images: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format
    ) -> torch.Tensor:
        """uint8 images (on the device) to normalised float32 in ``memory_format``, in one copy."""
        mean, std = self._device_constants
        if mean.device != images.device:  # once per run (per device a test moves to)
            mean, std = self._device_constants = self.mean.to(images.device), self.std.to(images.device)
        return images.to(torch.float32, memory_format=memory_format).sub_(mean).div_(std)

    def batch(self, batch: Any, state: State) -> tuple[torch.Tensor, torch.Tensor, int]:
        images, labels = batch
        images = self.normalise(images.to(state.device, non_blocking=True), state.memory_format)
        return images, labels.to(state.device, non_blocking=True), len(labels)

    def loss(self, name: str) -> LossFunction:
        return LOSSES[name]

    def evaluator(self, state: State) -> ClassificationEvaluator:
        return ClassificationEvaluator(state.num_classes, state.device, state.world_size)


def build(data: DataConfig | None = None) -> ImageClassification:
    return ImageClassification(data)
