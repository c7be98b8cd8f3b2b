"""Image classification: uint8 images normalised on the device, class labels, top-1 as quality.

Batches are ``(images, labels)`` with images uint8 (N, 3, H, W), on the CPU or already on the
device, whichever loader read them; the task normalises them on the device with ``data.mean`` and
``data.std``, straight into the run's memory format. Evaluation: top-1 and top-5 accuracy and
the mean cross-entropy, as sums summed over ranks in one all-reduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainrun import run_files
from trainrun.atomic_io import atomic_write
from trainrun.core.state import State
from trainrun.schema import DataConfig, TrainConfig
from trainrun.tasks.base import Evaluator, LossFunction, Task
from trainrun.tasks.losses import LOSSES


class ClassificationEvaluator(Evaluator):
    """Top-1 and top-k (k = 5, or every class below 5) accuracy and the mean cross-entropy.

    Counted here rather than with torchmetrics' ``MulticlassAccuracy`` (what the tests check these
    counts against): importing torchmetrics loads its audio and text metrics, scipy.signal and
    transformers, 2.3 s of every image run's 7 s start-up on a 2-core CPU, for two counts that
    share the loss's one all-reduce (torchmetrics gathers each metric's state on its own).
    """

    def __init__(self, num_classes: int, device: torch.device, world_size: int) -> None:
        self.top_k = min(5, num_classes)
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, samples, top-1, top-k hits
        self.world_size = world_size

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        ranked = outputs.topk(self.top_k, dim=1).indices
        hits = ranked == targets[:, None]
        self.sums[0] += F.cross_entropy(outputs.float(), targets, reduction="sum")
        self.sums[1] += len(targets)
        self.sums[2] += hits[:, 0].sum()
        self.sums[3] += hits.sum()

    def compute(self) -> dict[str, float]:
        if self.world_size > 1:
            dist.all_reduce(self.sums)
        loss, samples, top1, top_k = (float(value) for value in self.sums)
        return {"top1": top1 / samples, "top5": top_k / samples, "eval_loss": loss / samples}


class ImageClassification(Task):
    name = "image_classification"
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

    def example_batch(self, config: TrainConfig, size: int, text: None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` uint8 images at ``data.resolution`` and their labels, as the loader gives them
        (values arbitrary: what trainrun estimate runs)."""
        side = config.data.resolution
        images = torch.randint(256, (size, 3, side, side), dtype=torch.uint8)
        return images, torch.randint(config.data.num_classes, (size,))

    def loss(self, name: str) -> LossFunction:
        return LOSSES[name]

    def evaluator(self, state: State) -> ClassificationEvaluator:
        return ClassificationEvaluator(state.num_classes, state.device, state.world_size)

    def export(self, state: State, run_dir: Path) -> list[str]:
        """``<run>/model.safetensors``: the final weights in the model's own layout (timm's for
        ``model=timm``, as ``model.weights`` and timm's ``pretrained_cfg_overlay=dict(file=...)`` read them)."""
        from safetensors.torch import save

        path = run_dir / run_files.WEIGHTS
        weights = {
            name: value.detach().cpu().contiguous().clone() for name, value in state.raw_model.state_dict().items()
        }
        atomic_write(path, lambda handle: handle.write(save(weights)))
        return [f"wrote {path} (the final weights, for model.weights)"]


def build(data: DataConfig | None = None) -> ImageClassification:
    return ImageClassification(data)
