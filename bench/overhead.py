"""Trainer overhead: trainrun's Trainer against a plain hand-written PyTorch loop.

Same model, same in-memory data, same batch and optimizer, one process. Rounds alternate
(plain, trainer, plain, trainer, ...) so that drift in machine speed hits both, and the best
round of each is compared: noise from other work on the machine only ever slows a round down.
Target: trainer / plain >= 0.98.

    .venv/bin/python bench/overhead.py [--steps 30] [--rounds 5] [--batch 128] [--resolution 32]
"""

from __future__ import annotations

import argparse
import time

import torch

from trainrun.core.engine import Engine
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data import TorchData
from trainrun.data.builtin import SyntheticImages, TensorImageDataset
from trainrun.loss import soft_cross_entropy
from trainrun.models import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.optim.schedules import build_scheduler
from trainrun.schema import DataConfig, ModelConfig, OptimizerConfig, SchedulerConfig
from trainrun.tasks.image_classification import ImageClassification


def in_memory_data(count: int, resolution: int, batch: int) -> TorchData:
    """Synthetic images materialised once as tensors, read through a plain DataLoader."""
    source = SyntheticImages(count, resolution, num_classes=10, seed=0)
    images = torch.stack([source[i][0] for i in range(count)])
    labels = torch.tensor([source[i][1] for i in range(count)])
    dataset = TensorImageDataset(images, labels)
    return TorchData(DataConfig(), dataset, dataset, batch, batch, seed=0)


def components(steps: int, data: TorchData):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="resnet_small", num_classes=10, width=32, blocks=[1, 1, 1]))
    optimizer = build_optimizer(model, OptimizerConfig(lr=0.1), data.train.batch_size)
    timeline = Timeline(len(data.train), data.train.batch_size, steps)
    scheduler = build_scheduler(optimizer, SchedulerConfig(t_warmup="0.1dur"), timeline, 1.0)
    return model, optimizer, scheduler, timeline


def plain_loop(steps: int, data: TorchData) -> float:
    """Images/s of the loop a user would write by hand."""
    model, optimizer, scheduler, _ = components(steps, data)
    model.train()
    done, started = 0, time.perf_counter()
    while done < steps:
        for images, targets in data.train:
            loss = soft_cross_entropy(model(data.prepare(images)), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            done += 1
            if done == steps:
                break
    loss.item()
    return steps * data.train.batch_size / (time.perf_counter() - started)


def trainer_loop(steps: int, data: TorchData) -> float:
    """Images/s of trainrun's Trainer on the same work, its one final evaluation subtracted."""
    model, optimizer, scheduler, timeline = components(steps, data)
    state = State(
        model,
        optimizer,
        timeline,
        torch.device("cpu"),
        Precision("fp32", "cpu"),
        loss_fn=soft_cross_entropy,
        task=ImageClassification(),
        data=data,
        num_classes=10,
    )
    settings = TrainerSettings(eval_interval=f"{steps + 1}ba", log_interval=10)
    trainer = Trainer(state, lambda _: (optimizer, scheduler), Engine([]), settings)
    started = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - started - state.accounts.seconds["eval"]  # timed from outside
    return steps * data.train.batch_size / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--resolution", type=int, default=32)
    args = parser.parse_args()
    data = in_memory_data(args.batch * 8, args.resolution, args.batch)
    plain_loop(5, data)  # warm-up: allocator, kernels
    plain, trainer = [], []
    for _ in range(args.rounds):
        plain.append(plain_loop(args.steps, data))
        trainer.append(trainer_loop(args.steps, data))
    ratio = max(trainer) / max(plain)
    print(
        f"device cpu, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"{args.resolution}px, {args.steps} steps x {args.rounds} rounds"
    )
    for name, rounds in (("plain loop", plain), ("trainer", trainer)):
        print(f"{name:<11}: {max(rounds):8.1f} img/s best  (rounds: {', '.join(f'{v:.1f}' for v in rounds)})")
    print(f"ratio trainer/plain: {ratio:.3f}  (target >= 0.98)")


if __name__ == "__main__":
    main()
