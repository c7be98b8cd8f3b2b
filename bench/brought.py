"""trainrun beside the tool a user of a brought model would run instead: the same model, data and steps
on this CPU, each side in its own process, one evaluator for both (docs/models.md).

- ``timm``: timm's own ``train.py``, from a checkout you give (``--timm DIR``; run with that checkout's
  timm on ``PYTHONPATH``, nothing of it copied into trainrun) against ``model=timm`` at the same
  architecture (``--arch``, default ``convnext_atto``) on an image folder of scikit-learn's digits
  written here as 64 px PNGs in class folders (1,400 training, 397 held out). Both read the folder
  through PIL with random-resized crops (0.08-1) and flips, ImageNet's mean and std, SGD (momentum 0.9,
  no weight decay, no label smoothing) at ``--lr`` with a cosine schedule and no warmup, batch 32,
  ``--epochs`` epochs, one loader worker. A step is timm's logged update time and trainrun's
  ``steps.jsonl`` (each the median warm step).
- ``transformers``: Hugging Face ``Trainer`` against ``model=transformers model.path=...`` on a
  transformers architecture (``--hf-arch``, default a 4-layer Qwen3 of width 128), both starting from
  the same ``save_pretrained`` folder (written here from the architecture's config, the data's
  vocabulary) and reading the same token windows of the built-in corpus (``data=stdlib_stream``,
  128 tokens + 1), AdamW at 1e-3 with a constant rate, batch 16, ``--steps`` steps. A step is
  Trainer's (a callback's clock around each step) and trainrun's ``steps.jsonl``.

The evaluator scores each side's final weights alike: top-1 on the held-out images (resized to 64 px,
no crop) with timm's model class; the next token's cross-entropy on the held-out windows with the
architecture's transformers class. Sides alternate which runs first from round to round; each ratio is
the peer's step over trainrun's (above 1: trainrun is faster), the rounds' beside their median.

    .venv/bin/python bench/brought.py [--only timm transformers] [--timm DIR] [--arch convnext_atto]
        [--epochs 1] [--steps 60] [--rounds 2] [--out /tmp/brought]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from peers_shared import ROOT, ratio_text, step_ms, trainrun_steps

TIMM_UPDATE = re.compile(r"Train: \d+ \[\s*(\d+)/\d+ .*?Time: ([\d.]+)s,")
SIDE = 64  # the digits' side in the image folder
TEXT = ["task=causal_lm", "data=stdlib_stream", "data.text.max_seq_len=128", "train_batch_size=16"]
TEXT_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32}  # fmt: skip


def run(command: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    """``command``'s standard output and error; the bench stops, naming it, where it fails."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"bench/brought.py: {' '.join(command[:5])} ... failed: {(result.stderr or result.stdout)[-2000:]}")
    return result.stdout + result.stderr


def trainrun(args: list[str], run_dir: Path) -> list[float]:
    """A trainrun run in its own process, in an emptied ``run_dir``: its steps' seconds."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run([sys.executable, "-m", "trainrun", *args, f"hydra.run.dir={run_dir}", "progress=false"],
        env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    return trainrun_steps(run_dir)


# ---------------------------------------------------------------- timm against timm's train.py


def digits_folder(root: Path) -> Path:
    """scikit-learn's digits as an image folder (``train/`` and ``val/``, a folder a class) of RGB PNGs."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    if (root / "val").is_dir():
        return root
    digits = load_digits()
    for index, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = root / ("train" if index < 1400 else "val") / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray((image / 16 * 255).astype(np.uint8)).convert("RGB").resize((SIDE, SIDE))
        picture.save(folder / f"{index}.png")
    return root


def timm_side(checkout: Path, arch: str, folder: Path, out: Path, epochs: int, lr: float, seed: int) -> list[float]:
    """timm's ``train.py`` on ``folder``: its updates' seconds; its last checkpoint under ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable, "train.py", "--data-dir", str(folder), "--val-split", "val", "--model", arch,
        "--num-classes", "10", "--img-size", str(SIDE), "--batch-size", "32", "--epochs", str(epochs), "--opt", "sgd",
        "--momentum", "0.9", "--weight-decay", "0", "--lr", str(lr), "--sched", "cosine", "--warmup-epochs", "0",
        "--smoothing", "0", "--color-jitter", "0", "--reprob", "0", "--workers", "1", "--no-prefetcher",
        "--device", "cpu", "--log-interval", "1", "--seed", str(seed), "--output", str(out), "--experiment", "run",
    ]  # fmt: skip
    logged = run(command, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)})
    updates = {int(index): float(seconds) for index, seconds in TIMM_UPDATE.findall(logged)}
    return [updates[index] for index in sorted(updates)]


def trainrun_timm_side(arch: str, folder: Path, out: Path, epochs: int, lr: float, seed: int) -> list[float]:
    args = [
        "model=timm", f"model.arch={arch}", "data=folder", f"data.path={folder}", "data.num_classes=10",
        f"data.resolution={SIDE}", f"data.eval_resolution={SIDE}", f"data.eval_resize={SIDE}", "data.num_workers=1",
        "train_batch_size=32", "eval_batch_size=32", "optimizer=sgd", f"optimizer.lr={lr}", "optimizer.momentum=0.9",
        "optimizer.nesterov=false", "optimizer.weight_decay=0", "scheduler=cosine", "scheduler.t_warmup=0ba",
        f"max_duration={epochs}ep", f"eval_interval={epochs}ep", f"seed={seed}",
    ]  # fmt: skip
    return trainrun(args, out)


@torch.no_grad()
def top1(arch: str, weights: dict[str, torch.Tensor], folder: Path) -> float:
    """The evaluator: top-1 of ``weights`` in timm's ``arch`` on the held-out images, ImageNet-normalised."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from trainrun.models.timm_models import timm_library

    model = timm_library().create_model(arch, num_classes=10)
    model.load_state_dict(weights)
    model.eval()
    normalise = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])  # fmt: skip
    held_out = ImageFolder(folder / "val", transform=normalise)
    right = 0
    for images, labels in torch.utils.data.DataLoader(held_out, batch_size=64):
        right += int((model(images).argmax(1) == labels).sum())
    return right / len(held_out)


def compare_timm(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file

    if args.timm is None or not (args.timm / "train.py").is_file():
        sys.exit(f"bench/brought.py: --timm {args.timm}: no train.py there (a checkout of timm's repository)")
    folder = digits_folder(args.out / "digits")

    def measure(side: str, round_: int) -> tuple[float, float]:
        out = args.out / "timm" / f"{side.split()[0]}-round{round_}"
        if side == "trainrun":
            durations = trainrun_timm_side(args.arch, folder, out, args.epochs, args.lr, round_)
            weights = load_file(out / "model.safetensors")
        else:
            durations = timm_side(args.timm, args.arch, folder, out, args.epochs, args.lr, round_)
            weights = torch.load(out / "run" / "last.pth.tar", map_location="cpu", weights_only=False)["state_dict"]
        return step_ms(durations), top1(args.arch, weights, folder)

    steps, accuracy = alternating(args.rounds, ("trainrun", "timm train.py"), measure)
    title = (f"timm: {args.arch} on digits at {SIDE} px from an image folder, batch 32, {args.epochs} epoch(s), "
             f"SGD {args.lr} cosine, {args.rounds} round(s)")  # fmt: skip
    print_table(title, steps, ("held-out top-1", accuracy, "{:.1%}"), "timm train.py")


# ---------------------------------------------------------------- transformers against Trainer


def text_windows(split: str) -> torch.Tensor:
    """The corpus' windows (129 tokens) the trainrun side trains on (``train``) or holds out (``val``)."""
    from trainrun.config import compose
    from trainrun.data.causal_text import stream_datasets
    from trainrun.validation import validate

    sets = stream_datasets(validate(compose([*TEXT, "model=gpt_tiny", "data.num_workers=0"]), files=False).data)
    chosen = sets.train if split == "train" else sets.val
    return torch.stack([chosen[index] for index in range(len(chosen))]), sets.text


def initial_folder(arch: str, out: Path) -> Path:
    """The architecture at :data:`TEXT_SHAPE` over the corpus' vocabulary, random weights, saved once."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainrun.models.weights import quiet_transformers

    folder = out / f"{arch}-initial"
    if not (folder / "config.json").is_file():
        _, text = text_windows("val")
        torch.manual_seed(0)
        config = AutoConfig.for_model(arch, vocab_size=text.vocab_size, **TEXT_SHAPE)
        with quiet_transformers():
            AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def trainer_side(folder: Path, out: Path, steps: int, seed: int) -> None:
    """(Run in its own process.) Trainer trains the folder's model on the trainrun side's windows,
    in its order of them (random, seeded); writes ``out/model`` and ``out/steps.json``."""
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds, self.started = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            self.seconds.append(time.perf_counter() - self.started)

    from trainrun.models.weights import quiet_transformers

    windows, _ = text_windows("train")
    samples = [{"input_ids": window, "labels": window} for window in windows]
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(folder)
    settings = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=16, max_steps=steps, learning_rate=1e-3,
        weight_decay=0.0, lr_scheduler_type="constant", max_grad_norm=0.0, logging_strategy="no", save_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, seed=seed, disable_tqdm=True,
    )  # fmt: skip
    clock = StepClock()
    Trainer(model=model, args=settings, train_dataset=samples, callbacks=[clock]).train()
    with quiet_transformers():
        model.save_pretrained(out / "model")
    (out / "steps.json").write_text(json.dumps(clock.seconds))


@torch.no_grad()
def held_out_loss(model_folder: Path, windows: torch.Tensor) -> float:
    """The evaluator: the next token's mean cross-entropy over the held-out windows."""
    from transformers import AutoModelForCausalLM

    from trainrun.models.weights import quiet_transformers

    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    total = count = 0.0
    for batch in windows.split(32):
        logits = model(input_ids=batch[:, :-1]).logits
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="sum"))
        count += batch[:, 1:].numel()
    return total / count


def compare_transformers(args: argparse.Namespace) -> None:
    folder, (held_out, _) = initial_folder(args.hf_arch, args.out / "transformers"), text_windows("val")

    def measure(side: str, round_: int) -> tuple[float, float]:
        out = args.out / "transformers" / f"{side}-round{round_}"
        if side == "trainrun":
            run_args = [*TEXT, "model=transformers", f"model.path={folder}", "optimizer=adamw", "optimizer.lr=1e-3",
                        "optimizer.weight_decay=0", "scheduler=constant", f"max_duration={args.steps}ba",
                        f"eval_interval={args.steps}ba", f"seed={round_}"]  # fmt: skip
            durations, model_folder = trainrun(run_args, out), out / "hf_model"
        else:
            shutil.rmtree(out, ignore_errors=True)
            command = [sys.executable, __file__, "--trainer-side", str(folder), "--out", str(out),
                       "--steps", str(args.steps), "--seed", str(round_)]  # fmt: skip
            run(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
            durations, model_folder = json.loads((out / "steps.json").read_text()), out / "model"
        return step_ms(durations), held_out_loss(model_folder, held_out)

    steps, losses = alternating(args.rounds, ("trainrun", "Trainer"), measure)
    title = (f"transformers: {args.hf_arch} {TEXT_SHAPE} on the built-in corpus, 128 tokens, batch 16, "
             f"{args.steps} steps, AdamW 1e-3, fp32, {args.rounds} round(s)")  # fmt: skip
    print_table(title, steps, ("held-out loss", losses, "{:.4f}"), "Trainer")


def alternating(
    rounds: int, sides: tuple[str, str], measure: Callable[[str, int], tuple[float, float]]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each side measured once a round (``measure(side, round)``: its step in ms and its quality), which
    runs first alternating from round to round; (steps by side, qualities by side)."""
    steps: dict[str, list[float]] = {side: [] for side in sides}
    qualities: dict[str, list[float]] = {side: [] for side in sides}
    for index in range(rounds):
        for side in sides if index % 2 == 0 else sides[::-1]:
            step, quality = measure(side, index + 1)
            steps[side].append(step)
            qualities[side].append(quality)
    return steps, qualities


def print_table(title: str, steps: dict[str, list[float]], quality: tuple[str, dict, str], peer: str) -> None:
    """Each side's median warm step and each round's, its quality by the one evaluator (``quality``: its
    name, the values by side, their format), and the peer's step over trainrun's; the machine's kind."""
    name, values, form = quality
    print(f"{title}, {cpu_kind()}")
    print(f"| side | step ms (median warm, each round) | {name} (each round) |")
    print("| --- | ---: | ---: |")
    for side in steps:
        rounds, judged = (", ".join(map(shown.format, row[side])) for shown, row in (("{:.1f}", steps), (form, values)))
        print(f"| {side} | {statistics.median(steps[side]):.1f} ({rounds}) | {judged} |")
    print(f"{peer}'s step / trainrun's: {ratio_text(steps[peer], steps['trainrun'])}\n")


def cpu_kind() -> str:
    """This machine's processor and whether it has AVX-512 (every timing says which kind it ran on)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "?")
    return f"{model}, {'AVX-512' if 'avx512f' in flags else 'AVX2 only'}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=("timm", "transformers"), default=("timm", "transformers"))
    parser.add_argument("--timm", type=Path, help="a checkout of timm's repository (its train.py)")
    parser.add_argument("--arch", default="convnext_atto")
    parser.add_argument("--hf-arch", default="qwen3")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/brought"))
    parser.add_argument("--trainer-side", type=Path, help=argparse.SUPPRESS)  # the Trainer side's own process
    args = parser.parse_args()
    if args.trainer_side:
        trainer_side(args.trainer_side, args.out, args.steps, args.seed)
        return
    if "timm" in args.only:
        compare_timm(args)
    if "transformers" in args.only:
        compare_transformers(args)


if __name__ == "__main__":
    main()
