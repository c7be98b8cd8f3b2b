"""Cost per training step of each speed-up method, relative to no method, in one run.

Every method runs alone with its default settings (activity windows opened to the whole run
where a default would leave it idle in a short benchmark: SWA, selective backprop, layer
freezing from the start) on the same model, data and batch, through trainrun's Trainer.
Methods are measured in alternating rounds and the best round of each is kept. The ratio is
step time with the method / step time without: below 1 is a method that makes steps cheaper
(progressive resizing, ColOut, FixRes, selective backprop, layer freezing), above 1 one that
costs (SAM, BlurPool, EMA, RandAugment). ``--write`` puts the table into docs/benchmarks.md.

    .venv/bin/python bench/algorithms.py [--model resnet18] [--resolution 64] [--batch 32]
        [--steps 16] [--rounds 2] [--device auto] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

import torch

from trainrun.algorithms import build_algorithms
from trainrun.algorithms.specs import SPECS
from trainrun.core.engine import Engine
from trainrun.core.precision import resolve_precision
from trainrun.core.state import State
from trainrun.core.time import Timeline
from trainrun.core.trainer import Trainer, TrainerSettings
from trainrun.data.build import build_data
from trainrun.kinds import offers
from trainrun.models.build import build_model
from trainrun.optim.optimizers import build_optimizer
from trainrun.optim.schedules import build_scheduler
from trainrun.schema import DataConfig, ModelConfig, OptimizerConfig, SchedulerConfig, TrainConfig
from trainrun.tasks.image_classification import ImageClassification
from trainrun.tasks.losses import soft_cross_entropy

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
START, END = "<!-- bench/algorithms.py:start -->", "<!-- bench/algorithms.py:end -->"


def method_config(name: str, resolution: int):
    """The method's default config, with windows opened so it acts within a short run."""
    overrides = {
        "fixres": {"train_resolution": resolution * 3 // 4},
        "swa": {"swa_start": "0dur", "swa_end": "1dur", "update_interval": "1ba"},
        "selective_backprop": {"start": 0.0, "end": 1.0},
        "layer_freezing": {"freeze_start": 0.0},
        "squeeze_excite": {"min_channels": 64},  # ResNet-18's widest convs have 512 channels
        "sam": {"interval": 10},  # the medium recipe's interval
    }
    return SPECS[name].config(**overrides.get(name, {}))


def step_seconds(name: str | None, args: argparse.Namespace, device: torch.device) -> float:
    """Seconds per optimizer step of ``args.steps`` steps with method ``name`` (or none)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=args.model, num_classes=10, initializers=[]))
    data_config = DataConfig(
        name="synthetic",
        resolution=args.resolution,
        eval_resolution=args.resolution,
        num_samples=args.batch * 2,  # two steps per epoch: epoch events fire during the run
        val_samples=args.batch,
    )
    data = build_data(data_config, args.batch, args.batch, seed=0, device=device)
    timeline = Timeline(data.batches_per_epoch, args.batch, args.steps)

    def optimization(final_model: torch.nn.Module):
        optimizer = build_optimizer(final_model, OptimizerConfig(lr=0.1), args.batch)
        return optimizer, build_scheduler(optimizer, SchedulerConfig(), timeline)

    precision, _ = resolve_precision(args.precision, device)
    state = State(
        model, None, timeline, device, precision, loss_fn=soft_cross_entropy, task=ImageClassification(), data=data,
        num_classes=10,
        train_resolution=args.resolution,
    )  # fmt: skip
    algorithms = build_algorithms({name: method_config(name, args.resolution)} if name else {})
    trainer = Trainer(state, optimization, Engine(algorithms), TrainerSettings(f"{args.steps}ba", args.steps))
    trainer.fit()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return state.accounts.train_seconds() / args.steps


def measure(args: argparse.Namespace) -> tuple[dict[str, float], torch.device]:
    """Best seconds per step of every method and of no method, rounds alternating."""
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    image_run = offers(TrainConfig())  # the schema's default run: image classification
    names = [None, *sorted(n for n in SPECS if SPECS[n].applies_to(image_run))]
    best: dict[str, float] = {}
    step_seconds(None, args, device)  # warm-up: allocator, kernels, page cache
    for _ in range(args.rounds):
        for name in names:
            seconds = step_seconds(name, args, device)
            key = name or "none"
            best[key] = min(best.get(key, float("inf")), seconds)
            print(f"  {key:<20} {seconds * 1000:8.1f} ms/step", file=sys.stderr)
    return best, device


def table(best: dict[str, float]) -> str:
    base = best["none"]
    rows = ["| method | ms / step | relative to none |", "| --- | ---: | ---: |"]
    rows.append(f"| none | {base * 1000:.1f} | 1.00 |")
    for name, seconds in sorted(best.items(), key=lambda item: item[1]):
        if name != "none":
            rows.append(f"| {name} | {seconds * 1000:.1f} | {seconds / base:.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", choices=["resnet_small", "resnet18", "resnet34", "resnet50"])
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp", "bf16"])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--write", action="store_true", help="put the table into docs/benchmarks.md")
    args = parser.parse_args()
    best, device = measure(args)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    header = (
        f"{datetime.date.today()}, {name}, torch {torch.__version__}: {args.model} at {args.resolution} px, "
        f"batch {args.batch}, {args.precision}, {args.steps} steps, best of {args.rounds} rounds:\n\n"
        f"```\n.venv/bin/python {' '.join(sys.argv)}\n```"
    )
    text = f"{header}\n\n{table(best)}"
    print(text)
    if args.write:
        docs = DOCS.read_text()
        block = f"{START}\n{text}\n{END}"
        if START in docs:
            docs = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, docs, flags=re.S)
        else:
            docs += f"\n## Speed-up methods (`bench/algorithms.py`)\n\n{block}\n"
        DOCS.write_text(docs)


if __name__ == "__main__":
    main()
