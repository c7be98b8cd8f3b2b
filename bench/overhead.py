"""Trainer overhead: trainrun's Trainer against a plain hand-written PyTorch loop.

Same model, same data through the same DataLoader, same batch, optimizer and schedule, one
process, for any of three tasks: a small ResNet on in-memory images (``--task image_classification``),
BERT-Tiny on the built-in text corpus, masked on the fly (``--task masked_lm``), or ``gpt_tiny`` on
the same corpus as a token stream (``--task causal_lm``: the plain loop is nanoGPT's). Rounds alternate
(plain, trainer, plain, trainer, ...) so that drift in machine speed hits both, and the best
round of each is compared: noise from other work on the machine only ever slows a round down.
Target: trainer / plain >= 0.98.

    .venv/bin/python bench/overhead.py [--task masked_lm|causal_lm] [--steps 30] [--rounds 5] [--batch N]
        [--resolution 32] [--seq 128] [--mlflow]

``--mlflow`` compares the Trainer with and without ``loggers=[mlflow]`` instead (target >= 0.99).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from trainrun.core.engine import Callback, Engine
from trainrun.core.events import Event
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data.build import Datasets, TorchData
from trainrun.data.builtin import SyntheticImages, TensorImageDataset
from trainrun.data.causal_text import stream_datasets
from trainrun.data.masked_text import text_datasets
from trainrun.models.build import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.optim.schedules import build_scheduler
from trainrun.schema import (
    BertConfig,
    DataConfig,
    GPTConfig,
    ModelConfig,
    OptimizerConfig,
    SchedulerConfig,
    SmallResNetConfig,
    TextConfig,
)
from trainrun.tasks.base import Task
from trainrun.tasks.causal_lm import CausalLanguageModeling, next_token_cross_entropy
from trainrun.tasks.image_classification import ImageClassification
from trainrun.tasks.losses import soft_cross_entropy
from trainrun.tasks.masked_lm import MaskedLanguageModeling, masked_cross_entropy


@dataclass
class Workload:
    """What both loops train: data, a model factory, the optimizer's config, and the task."""

    data: TorchData
    model: Callable[[], nn.Module]
    optimizer: OptimizerConfig
    task: Task
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    step: Callable[[nn.Module, object], torch.Tensor]  # the hand-written loop's forward and loss
    unit: str


def image_workload(batch: int, resolution: int) -> Workload:
    """Synthetic images materialised once as tensors, a small ResNet, SGD."""
    count = batch * 8
    source = SyntheticImages(count, resolution, num_classes=10, seed=0)
    images = torch.stack([source[i][0] for i in range(count)])
    labels = torch.tensor([source[i][1] for i in range(count)])
    dataset = TensorImageDataset(images, labels)
    data = TorchData(DataConfig(), Datasets(dataset, dataset), batch, batch, seed=0)
    task = ImageClassification()

    def step(model: nn.Module, loaded) -> torch.Tensor:
        images, targets = loaded
        return soft_cross_entropy(model(task.normalise(images)), targets)

    config = ModelConfig(
        name="resnet_small", num_classes=10, resnet_small=SmallResNetConfig(width=32, blocks=[1, 1, 1])
    )
    return Workload(
        data,
        lambda: build_model(config),
        OptimizerConfig(lr=0.1),
        task,
        soft_cross_entropy,
        step,
        "img",
    )


def text_workload(batch: int, seq: int) -> Workload:
    """The built-in corpus's token store (written once into the cache), BERT-Tiny, AdamW."""
    config = DataConfig(name="text", text=TextConfig(corpus="stdlib_docs", max_seq_len=seq))
    sets = text_datasets(config)
    data = TorchData(config, sets, batch, batch, seed=0)

    def step(model: nn.Module, loaded) -> torch.Tensor:
        inputs = {
            key: loaded[key]
            for key in ("input_ids", "attention_mask", "lengths", "predict_positions", "predict_counts")
        }
        return masked_cross_entropy(
            model(inputs),
            {"labels": loaded["labels"], "predicted": loaded["predicted_labels"], "counts": loaded["predict_counts"]},
        )

    model = ModelConfig(name="bert", bert=BertConfig(layers=2, hidden_size=128, heads=2, intermediate_size=512))
    optimizer = OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.01)
    return Workload(
        data,
        lambda: build_model(model, sets.text),
        optimizer,
        MaskedLanguageModeling(),
        masked_cross_entropy,
        step,
        "seq",
    )


def stream_workload(batch: int, seq: int) -> Workload:
    """The built-in corpus as one stream of windows, gpt_tiny, AdamW: nanoGPT's loop by hand."""
    config = DataConfig(name="token_stream", text=TextConfig(corpus="stdlib_docs", max_seq_len=seq))
    sets = stream_datasets(config)
    data = TorchData(config, sets, batch, batch, seed=0)

    def step(model: nn.Module, windows: torch.Tensor) -> torch.Tensor:
        return next_token_cross_entropy(model(windows[:, :-1]), windows[:, 1:])

    model = ModelConfig(name="gpt", gpt=GPTConfig(max_seq_len=seq))
    optimizer = OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.0)
    return Workload(
        data,
        lambda: build_model(model, sets.text),
        optimizer,
        CausalLanguageModeling(),
        next_token_cross_entropy,
        step,
        "seq",
    )


def components(steps: int, work: Workload):
    torch.manual_seed(0)
    model = work.model()
    optimizer = build_optimizer(model, work.optimizer, work.data.train.batch_size)
    timeline = Timeline(len(work.data.train), work.data.train.batch_size, steps)
    scheduler = build_scheduler(optimizer, SchedulerConfig(t_warmup="0.1dur"), timeline)
    return model, optimizer, scheduler, timeline


def plain_loop(steps: int, work: Workload) -> float:
    """Samples/s of the loop a user would write by hand."""
    model, optimizer, scheduler, _ = components(steps, work)
    model.train()
    done, started = 0, time.perf_counter()
    while done < steps:
        for loaded in work.data.train:
            loss = work.step(model, loaded)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            done += 1
            if done == steps:
                break
    loss.item()
    return steps * work.data.train.batch_size / (time.perf_counter() - started)


def trainer_for(steps: int, work: Workload, eval_interval: str, callbacks: list[Callback] | None = None) -> Trainer:
    """trainrun's Trainer on ``work`` (the plain loop's model, optimizer and schedule), fp32, one process."""
    model, optimizer, scheduler, timeline = components(steps, work)
    state = State(
        model,
        optimizer,
        timeline,
        torch.device("cpu"),
        Precision("fp32", "cpu"),
        loss_fn=work.loss,
        task=work.task,
        data=work.data,
        num_classes=10,
    )
    settings = TrainerSettings(eval_interval=eval_interval, log_interval=10)
    return Trainer(state, lambda _: (optimizer, scheduler), Engine([], callbacks or []), settings)


class FitEndClock(Callback):
    """Notes when FIT_END fires, before the callbacks after it close their files."""

    def run_event(self, event: Event, state: State) -> None:
        if event is Event.FIT_END:
            self.at = time.perf_counter()


def tracked_loop(steps: int, work: Workload, eval_every: int, store: Path | None) -> float:
    """Samples/s of the Trainer evaluating every ``eval_every`` steps, to the start of FIT_END
    (evaluations included), with an MLflow logger on a SQLite store in ``store`` if given."""
    clock = FitEndClock()
    callbacks: list[Callback] = [clock]
    if store is not None:  # built before the clock starts, as a run builds it before training
        from trainrun.loggers.mlflow import MlflowLogger
        from trainrun.schema import MlflowConfig, TrainConfig

        run_dir = Path(tempfile.mkdtemp(dir=store))
        config = TrainConfig(mlflow=MlflowConfig(tracking_uri=f"sqlite:///{store / 'mlflow.db'}"))
        callbacks.append(MlflowLogger(run_dir, config))
    trainer = trainer_for(steps, work, f"{eval_every}ba", callbacks)
    started = time.perf_counter()
    trainer.fit()
    return steps * work.data.train.batch_size / (clock.at - started)


def trainer_loop(steps: int, work: Workload) -> float:
    """Samples/s of trainrun's Trainer on the same work, its one final evaluation subtracted."""
    trainer = trainer_for(steps, work, f"{steps + 1}ba")
    started = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - started - trainer.state.accounts.seconds["eval"]  # timed from outside
    return steps * work.data.train.batch_size / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=["image_classification", "masked_lm", "causal_lm"], default="image_classification"
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, help="default: 128 images or 32 sequences")
    parser.add_argument("--resolution", type=int, default=32, help="image_classification: pixels")
    parser.add_argument("--seq", type=int, default=128, help="masked_lm, causal_lm: tokens per sequence")
    parser.add_argument(
        "--mlflow",
        action="store_true",
        help="instead: the Trainer with loggers=[mlflow] (a SQLite store) against without, evaluating every 10 steps",
    )
    args = parser.parse_args()
    if args.task == "masked_lm":
        args.batch = args.batch or 32
        work, shape = text_workload(args.batch, args.seq), f"BERT-Tiny, {args.seq} tokens"
    elif args.task == "causal_lm":
        args.batch = args.batch or 32
        work, shape = stream_workload(args.batch, args.seq), f"gpt_tiny, {args.seq} tokens"
    else:
        args.batch = args.batch or 128
        work, shape = image_workload(args.batch, args.resolution), f"{args.resolution}px"
    plain_loop(5, work)  # warm-up: allocator, kernels
    if args.mlflow:
        compare_mlflow(args, work, shape)
        return
    plain, trainer = [], []
    for _ in range(args.rounds):
        plain.append(plain_loop(args.steps, work))
        trainer.append(trainer_loop(args.steps, work))
    ratio = max(trainer) / max(plain)
    print(
        f"{args.task}: device cpu, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"{shape}, {args.steps} steps x {args.rounds} rounds"
    )
    for name, rounds in (("plain loop", plain), ("trainer", trainer)):
        print(f"{name:<11}: {max(rounds):8.1f} {work.unit}/s best  (rounds: {', '.join(f'{v:.1f}' for v in rounds)})")
    print(f"ratio trainer/plain: {ratio:.3f}  (target >= 0.98)")


def compare_mlflow(args: argparse.Namespace, work: Workload, shape: str) -> None:
    """The MLflow logger's cost: rounds alternate without and with it; best of each."""
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder)
        tracked_loop(5, work, 5, store)  # the store's tables made once, as the first run in a folder does
        without, tracked = [], []
        for _ in range(args.rounds):
            without.append(tracked_loop(args.steps, work, 10, None))
            tracked.append(tracked_loop(args.steps, work, 10, store))
    print(
        f"{args.task}: device cpu, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"{shape}, {args.steps} steps x {args.rounds} rounds, an evaluation every 10 steps"
    )
    for name, rounds in (("trainer", without), ("+ mlflow", tracked)):
        print(f"{name:<11}: {max(rounds):8.1f} {work.unit}/s best  (rounds: {', '.join(f'{v:.1f}' for v in rounds)})")
    print(f"ratio with/without mlflow: {max(tracked) / max(without):.3f}  (target >= 0.99)")


if __name__ == "__main__":
    main()
