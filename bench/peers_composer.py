"""Composer's side of ``bench/peers.py``'s ResNet comparison, and the evaluator both sides share.

Run by ``bench/peers.py`` with the Python of the side environment it made (``pip install mosaicml``:
Composer pins an older torch than trainrun's); it imports torch, torchvision and Composer only.
It trains trainrun's ``resnet_small`` (the same modules, so the same ``state_dict`` keys; the
initial weights trainrun drew, from ``--weights``) on the images and labels in ``--data`` (an .npz
of uint8 (N, 3, 28, 28) train/val arrays and their labels), as a Composer user writes it: a torch
``DataLoader`` with torchvision's pad-and-crop, ``ComposerClassifier``, ``DecoupledSGDW``, warmup +
cosine, and ``--methods`` (Composer's algorithm classes); it writes each epoch's held-out accuracy
and training seconds (evaluation excluded) to ``--result``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.models.resnet import BasicBlock
from torchvision.transforms import v2

MEAN, STD = 0.13 * 255, 0.31 * 255  # data=mnist5k's normalisation, on 0-255 pixels


@torch.no_grad()
def top1(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """The evaluator both sides share: top-1 accuracy on uint8 images, normalised as mnist5k's."""
    was_training = model.training
    model.eval()
    right = 0
    for start in range(0, len(labels), 512):
        batch = (images[start : start + 512].float() - MEAN) / STD
        right += int((model(batch).argmax(1) == labels[start : start + 512]).sum())
    model.train(was_training)
    return right / len(labels)


class SmallResNet(nn.Module):
    """``model=resnet_small`` at its defaults, module for module (a stride-1 3x3 stem, torchvision
    BasicBlock stages doubling in width, stride 2 after the first): the same ``state_dict`` keys."""

    def __init__(self, num_classes: int = 10, width: int = 32, blocks: tuple[int, ...] = (1, 1, 1)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        stages, channels = [], width
        for index, count in enumerate(blocks):
            out, stride = width * 2**index, 1 if index == 0 else 2
            down = None
            if stride != 1 or channels != out:
                down = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            stages.append(
                nn.Sequential(
                    BasicBlock(channels, out, stride, down), *(BasicBlock(out, out) for _ in range(count - 1))
                )
            )
            channels = out
        self.layers, self.avgpool, self.fc = (
            nn.Sequential(*stages),
            nn.AdaptiveAvgPool2d(1),
            nn.Linear(channels, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.layers(self.relu(self.bn1(self.conv1(images))))
        return self.fc(torch.flatten(self.avgpool(features), 1))


class Images(Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: v2.Transform) -> None:
        self.images, self.labels, self.augment = torch.from_numpy(images), torch.from_numpy(labels).long(), augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.augment(self.images[index]).float() - MEAN) / STD, self.labels[index]


def train_loader(arrays, batch: int) -> DataLoader:
    """The training images as a Composer user (and the hand loop) reads them: a torch DataLoader,
    each image padded-and-cropped as mnist5k's, shuffled, the last partial batch dropped."""
    images = Images(arrays["train_images"], arrays["train_labels"], v2.RandomCrop(28, padding=2))
    return DataLoader(images, batch, shuffle=True, drop_last=True)


def plain_profile(arrays, weights: str, steps: int, batch: int = 64, lr: float = 0.2) -> dict[str, float]:
    """A hand-written loop of the same training (the same loader, model and SGD with momentum) on
    whichever torch runs it: the median ms of each phase of a step, after the first tenth."""
    module = SmallResNet()
    module.load_state_dict(torch.load(weights))
    loader = train_loader(arrays, batch)
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    phases: dict[str, list[float]] = {"data": [], "forward": [], "backward": [], "optimizer": []}
    batches = iter(())
    for _ in range(steps):
        began = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            images, labels = next(batches)
        marks = [began, time.perf_counter()]
        loss = nn.functional.cross_entropy(module(images), labels)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        for name, start, end in zip(phases, marks, marks[1:]):
            phases[name].append(end - start)
    skip = max(2, steps // 10)
    return {name: 1000 * float(np.median(values[skip:])) for name, values in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--methods", nargs="*", default=[])
    parser.add_argument("--profile-steps", type=int, help="time a hand-written loop on this torch instead")
    args = parser.parse_args()
    arrays = np.load(args.data)
    if args.profile_steps:
        with open(args.result, "w") as file:
            json.dump({"torch": torch.__version__, **plain_profile(arrays, args.weights, args.profile_steps)}, file)
        return
    from composer import Callback, Trainer, algorithms
    from composer.models import ComposerClassifier
    from composer.optim import CosineAnnealingWithWarmupScheduler, DecoupledSGDW

    module = SmallResNet()
    module.load_state_dict(torch.load(args.weights))
    held_out = torch.from_numpy(arrays["val_images"]), torch.from_numpy(arrays["val_labels"]).long()
    train = train_loader(arrays, args.batch)
    settings = {
        "BlurPool": {"replace_convs": True, "replace_maxpools": True, "blur_first": True, "min_channels": 16},
        "ChannelsLast": {},
        "LabelSmoothing": {"smoothing": 0.1},
        "ProgressiveResizing": {
            "mode": "resize",
            "initial_scale": 0.5,
            "delay_fraction": 0.4,
            "finetune_fraction": 0.2,
            "size_increment": 4,
        },
        "ColOut": {"p_row": 0.15, "p_col": 0.15, "batch": True},
    }  # trainrun's defaults for the same methods

    class EpochAccuracy(Callback):
        """The shared evaluator after each epoch; training seconds with evaluation left out."""

        def __init__(self) -> None:
            self.rows, self.started, self.evaluating = [], 0.0, 0.0

        def fit_start(self, state, logger) -> None:
            self.started = time.perf_counter()

        def epoch_end(self, state, logger) -> None:
            seconds = time.perf_counter() - self.started - self.evaluating
            began = time.perf_counter()
            self.rows.append(
                {"epoch": len(self.rows) + 1, "train_seconds": seconds, "accuracy": top1(state.model.module, *held_out)}
            )
            self.evaluating += time.perf_counter() - began

    recorder = EpochAccuracy()
    duration = f"{len(train) * args.epochs}ba"  # in batches: progressive resizing grows every step, not every epoch
    optimizer = DecoupledSGDW(module.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    trainer = Trainer(
        model=ComposerClassifier(module, num_classes=10), train_dataloader=train, max_duration=duration,
        optimizers=optimizer, schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="1ep", alpha_f=0.0),
        algorithms=[getattr(algorithms, name)(**settings[name]) for name in args.methods], callbacks=[recorder],
        device="cpu", progress_bar=False, log_to_console=False, loggers=[], seed=42,
    )  # fmt: skip
    trainer.fit()
    with open(args.result, "w") as file:
        json.dump(recorder.rows, file)


if __name__ == "__main__":
    main()
