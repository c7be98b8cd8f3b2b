"""trainrun against the tools its users would pick instead, side by side on the same data.

- ``gpt``: nanoGPT's own ``train.py`` and ``model.py`` from a checkout you give (``--nanogpt DIR``;
  nothing of it is copied into trainrun, and the checkout is not written to) against
  ``recipe=gpt125`` at ``bench/gpt.py``'s companion size (``gpt_tiny``: 2 layers, 2 heads, width 128,
  64-token windows, batch 16, fp32, dropout 0.1, biases, tied head, AdamW betas (0.9, 0.999), no
  weight decay, gradients clipped at 1.0, the recipe's warmup and cosine to 0 shrunk to ``--steps``).
  nanoGPT reads the same token stream (written as its ``train.bin``; it draws random windows of it,
  as it does). Both sides are swept over ``--rates`` (the tuned baseline: the best rate's loss),
  and ``recipe=gpt_speedrun`` (its own rates) is timed to nanoGPT's best loss. A few steps at GPT-2
  125M's shape (12 layers, width 768, batch 1 x 1,024 tokens) compare the steps where matrix
  products dominate.
- ``bert``: Hugging Face ``Trainer`` with ``BertForMaskedLM`` from the initial weights trainrun's
  run draws (exported as a ``save_pretrained`` folder), the same packed 128-token samples, AdamW at
  2e-3, one epoch of warmup then cosine, 15 % of tokens masked 80/10/10
  (``DataCollatorForLanguageModeling``), against the documented CPU companion with the full head and
  with ``masked_head``; user and system CPU seconds of each side's process are printed beside its
  time. Round r runs every side with seed r (trainrun's ``seed``, which also draws the initial
  weights Trainer starts from; ``TrainingArguments.seed``), and each round's accuracy is printed:
  at a few epochs BERT sits on its unigram plateau or has just left it, and which depends on the
  seed on both sides alike (docs/benchmarks.md), so one seeded round compares luck.
- ``resnet``: Composer (``pip install mosaicml`` into a side environment the bench makes on first use,
  ``--composer-env``) training trainrun's ``resnet_small`` on MNIST-5k (its initial weights, its
  training and held-out images, SGD with momentum, warmup + cosine) bare and with five methods, run
  by ``bench/peers_composer.py`` in that environment.

``--device cuda`` runs the GPU sections instead (GPT-2 124M, BERT-Base, Llama 3.2 1B's shape,
ResNet-50 against nanoGPT, Trainer and Lightning: ``peers_gpu.py``), ``--scale tiny`` the same on a CPU.

One evaluator, written here, scores every side's final model on the same held-out data
(validation loss of the next token; masked-token accuracy on trainrun's fixed masks; top-1
accuracy), and each trainrun side's own last evaluation is checked against it. Time is training
time as each side reports it (evaluation excluded); a step's time is the median after the first tenth of
the steps. Sides alternate which runs first from round to round; every ratio is a peer's time over
trainrun's (above 1: trainrun is faster), with each round's ratio beside the median.

    .venv/bin/python bench/peers.py [--only gpt bert resnet] [--nanogpt DIR] [--rounds 2] [--steps 400]
        [--rates 6e-4 2e-3 6e-3 1e-2] [--epochs 3] [--composer-env DIR] [--out /tmp/peers]
    python3 bench/peers.py --device cuda [--only gpt bert llama resnet] [--nanogpt DIR] [--rounds 1]
        [--section-limit 130] [--bert-target 0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gpt import COMPANION, SHRUNK, schedule_ratio
from peers_shared import (
    BERT_COMPANION,
    ROOT,
    bert_sets,
    bert_tokenizer,
    nanogpt_command,
    nanogpt_durations,
    nanogpt_loss,
    nanogpt_workdir,
    padded_samples,
    ratio_text,
    step_ms,
    trainrun_gpt_loss,
    trainrun_steps,
    warm,
)

BENCH = Path(__file__).resolve().parent
# each GPT shape compared: trainrun's arguments changed from bench/gpt.py's companion (None: the
# recipe's own), nanoGPT's settings
SHAPES = {
    "gpt_tiny": ({}, {"n_layer": 2, "n_head": 2, "n_embd": 128, "block_size": 64, "batch_size": 16}),
    "gpt125": (
        {"model": None, "model.gpt.heads": None, "data.text.max_seq_len": "1024", "train_batch_size": "1",
         "eval_batch_size": "4"},
        {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "batch_size": 1},
    ),
}  # fmt: skip


def timed(command: list[str], cwd: Path | None = None, env: dict | None = None) -> tuple[str, float, float]:
    """Run ``command``; (its standard output, user and system CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit(f"bench/peers.py: {' '.join(command[:4])} ... failed: {result.stderr.strip()[-2000:]}")
    return result.stdout, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def trainrun(args: list[str], run_dir: Path) -> tuple[list[dict], float, float]:
    """A trainrun run as a user runs it (its own process) in an emptied ``run_dir``: its evaluations
    and its CPU seconds (user, system)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "trainrun", *args, f"hydra.run.dir={run_dir}"]
    _, user, system = timed(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], user, system


# ---------------------------------------------------------------- GPT against nanoGPT


def gpt_windows() -> tuple[torch.Tensor, torch.Tensor, int]:
    """The companion's training and validation windows (64 + 1 tokens each) and vocabulary size."""
    from trainrun.config import compose
    from trainrun.data.causal_text import stream_datasets
    from trainrun.validation import validate

    config = validate(compose(["task=causal_lm", *COMPANION, "data.num_workers=0"]), files=False)
    sets = stream_datasets(config.data)
    return (
        sets.train.__getitems__(list(range(len(sets.train)))),
        sets.val.__getitems__(list(range(len(sets.val)))),
        sets.text.vocab_size,
    )


def gpt_companion(shape: str) -> list[str]:
    """bench/gpt.py's companion arguments at ``shape``."""
    arguments = dict(argument.split("=", 1) for argument in COMPANION) | SHAPES[shape][0]
    return [f"{key}={value}" for key, value in arguments.items() if value is not None]


def nanogpt(
    nanogpt_dir: Path, work: Path, rate: float, steps: int, out_dir: Path, shape: str = "gpt_tiny"
) -> tuple[float, list[float]]:
    """nanoGPT's train.py at ``shape`` with gpt125's settings: (training seconds, each step's)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    stdout, _, _ = timed(nanogpt_command(nanogpt_dir, rate, steps, out_dir, SHAPES[shape][1]), cwd=work)
    durations = nanogpt_durations(stdout, steps)
    return sum(durations), durations


def checked(rows: list[dict], run_dir: Path, evaluator_value: float, metric: str) -> float:
    """The evaluator's value, after checking the run's own last evaluation agrees with it."""
    own = rows[-1][metric]
    if abs(own - evaluator_value) > 1e-3 * max(1.0, abs(own)):
        sys.exit(f"bench/peers.py: {run_dir}: trainrun's {metric} {own:.4f} != the evaluator's {evaluator_value:.4f}")
    return evaluator_value


def compare_gpt(args: argparse.Namespace) -> None:
    if args.nanogpt is None:
        print("gpt: skipped (give a nanoGPT checkout with --nanogpt DIR)\n")
        return
    train, val, vocab = gpt_windows()
    work = nanogpt_workdir(args.nanogpt, args.out, train, val, vocab)
    ratio = schedule_ratio("gpt125", args.steps)
    rows: dict[tuple[str, float], list[tuple[float, float, float]]] = {}  # (side, lr) -> (loss, s, ms a step)
    for index in range(args.rounds):
        for rate in args.rates:
            sides = ["nanogpt", "trainrun"] if index % 2 == 0 else ["trainrun", "nanogpt"]
            for side in sides:
                out = args.out / "gpt" / f"{side}-{rate:g}-round{index + 1}"
                if side == "nanogpt":
                    seconds, durations = nanogpt(args.nanogpt, work, rate, args.steps, out)
                    loss = nanogpt_loss(args.nanogpt, out, val)
                else:
                    runs = [
                        "recipe=gpt125",
                        *gpt_companion("gpt_tiny"),
                        ratio,
                        f"optimizer.lr={rate}",
                        f"eval_interval={args.steps}ba",
                    ]
                    metrics, _, _ = trainrun(runs, out)
                    loss = checked(metrics, out, trainrun_gpt_loss(out, val), "eval_loss")
                    seconds, durations = metrics[-1]["train_seconds"], trainrun_steps(out)
                rows.setdefault((side, rate), []).append((loss, seconds, step_ms(durations)))
    large = [compare_steps_at_gpt125(args, work, index) for index in range(args.rounds)]
    speedrun_dir = args.out / "gpt" / "trainrun-speedrun"
    speedrun_args = [
        "recipe=gpt_speedrun", *COMPANION, *SHRUNK["gpt_speedrun"], "eval_interval=20ba",
        schedule_ratio("gpt_speedrun", args.steps),
    ]  # fmt: skip
    speedrun, _, _ = trainrun(speedrun_args, speedrun_dir)
    checked(speedrun, speedrun_dir, trainrun_gpt_loss(speedrun_dir, val), "eval_loss")
    print_gpt(args, rows, speedrun, large)


def compare_steps_at_gpt125(args: argparse.Namespace, work: Path, index: int) -> dict[str, float]:
    """One round of ``--large-steps`` steps at GPT-2 125M's shape (batch 1 x 1,024 tokens, the
    built-in stream's vocabulary): each side's median ms a step."""
    steps, rate, result = args.large_steps, 6e-4, {}
    ratio = schedule_ratio("gpt125", steps)
    for side in ("nanogpt", "trainrun") if index % 2 == 0 else ("trainrun", "nanogpt"):
        out = args.out / "gpt" / f"{side}-gpt125-round{index + 1}"
        if side == "nanogpt":
            durations = nanogpt(args.nanogpt, work, rate, steps, out, "gpt125")[1]
        else:
            trainrun(["recipe=gpt125", *gpt_companion("gpt125"), ratio, f"eval_interval={steps}ba"], out)
            durations = trainrun_steps(out)
        result[side] = step_ms(durations)
    return result


def print_gpt(args: argparse.Namespace, rows: dict, speedrun: list[dict], large: list[dict[str, float]]) -> None:
    print(
        f"gpt: trainrun recipe=gpt125 vs nanoGPT train.py, gpt_tiny shape, 16 x 64 tokens, {args.steps} steps, "
        f"fp32, {args.rounds} round(s), torch {torch.__version__}"
    )
    print("| side | lr | validation loss (median of rounds) | train s | ms a step (median of rounds) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (side, rate), values in rows.items():
        loss, seconds, ms = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"| {side} | {rate:g} | {loss:.4f} | {seconds:.1f} | {ms:.1f} |")
    ours = [ms for rate in args.rates for (_, _, ms) in rows[("trainrun", rate)]]
    peer = [ms for rate in args.rates for (_, _, ms) in rows[("nanogpt", rate)]]
    print(f"step speed, nanoGPT's ms a step / trainrun's (every rate and round): {ratio_text(peer, ours)}")
    ours, peer = [r["trainrun"] for r in large], [r["nanogpt"] for r in large]
    print(
        f"step speed at gpt125's shape (12 x 768, batch 1 x 1,024 tokens, {args.large_steps} steps; trainrun "
        f"{statistics.median(ours):,.0f} ms, nanoGPT {statistics.median(peer):,.0f} ms): {ratio_text(peer, ours)}"
    )
    best = {
        side: min(args.rates, key=lambda r: statistics.median(v[0] for v in rows[(side, r)]))
        for side in ("nanogpt", "trainrun")
    }
    target = statistics.median(v[0] for v in rows[("nanogpt", best["nanogpt"])])
    peer_seconds = statistics.median(v[1] for v in rows[("nanogpt", best["nanogpt"])])
    ours_best = statistics.median(v[0] for v in rows[("trainrun", best["trainrun"])])
    print(
        f"tuned baselines: nanoGPT's best rate {best['nanogpt']:g} ends at {target:.4f} in {peer_seconds:.1f} s; "
        f"trainrun gpt125's best rate {best['trainrun']:g} at {ours_best:.4f}"
    )
    reached = next((row["train_seconds"] for row in speedrun if row["eval_loss"] <= target), None)
    if reached is None:
        print(f"recipe=gpt_speedrun: ends at {speedrun[-1]['eval_loss']:.4f}, not reaching nanoGPT's best {target:.4f}")
    else:
        print(
            f"time to nanoGPT's best loss: recipe=gpt_speedrun {reached:.1f} s "
            f"(ends at {speedrun[-1]['eval_loss']:.4f}): "
            f"**{peer_seconds / reached:.2f}x** nanoGPT's tuned run"
        )
    print()


# ---------------------------------------------------------------- BERT against Hugging Face Trainer


def hf_bert_side(out: Path, epochs: int, seed: int) -> None:
    """(Run in its own process.) Trainer trains ``BertForMaskedLM`` from the initial weights
    trainrun's companion run draws (exported as a ``save_pretrained`` folder) on the companion's
    samples; writes ``out/model`` and ``out/result.json``."""
    from transformers import (
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    from trainrun.config import compose
    from trainrun.core.seeding import seed_everything
    from trainrun.models.build import build_model
    from trainrun.models.weights import export_pretrained
    from trainrun.validation import validate

    sets = bert_sets()
    train = sets.train
    samples, tokenizer = padded_samples(train), bert_tokenizer(train)
    config = validate(compose([*BERT_COMPANION, f"seed={seed}"]), files=False)
    seed_everything(config.seed)
    export_pretrained(build_model(config.model, sets.text), train.tokenizer_file, out / "initial")
    model = BertForMaskedLM.from_pretrained(out / "initial")
    steps_per_epoch = len(samples) // 32
    settings = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=32, num_train_epochs=epochs, learning_rate=2e-3,
        weight_decay=0.05, warmup_steps=steps_per_epoch, lr_scheduler_type="cosine", max_grad_norm=0.0,
        dataloader_drop_last=True, logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, seed=seed, disable_tqdm=True,
    )  # fmt: skip
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=train.mlm_probability)
    result = Trainer(model=model, args=settings, train_dataset=samples, data_collator=collator).train()
    model.save_pretrained(out / "model")
    (out / "result.json").write_text(json.dumps({"train_seconds": result.metrics["train_runtime"]}))


@torch.no_grad()
def masked_accuracy(model_dir: Path, held_out) -> float:
    """The evaluator: argmax accuracy on the held-out samples' masked tokens (trainrun's fixed masks)."""
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(model_dir).eval()
    right = total = 0
    for start in range(0, len(held_out), 64):
        batch = [held_out[i] for i in range(start, min(start + 64, len(held_out)))]
        ids, mask = (torch.stack([s[key] for s in batch]) for key in ("input_ids", "attention_mask"))
        labels = torch.stack([s["labels"] for s in batch])
        chosen = labels != -100
        predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        right += int((predicted[chosen] == labels[chosen]).sum())
        total += int(chosen.sum())
    return right / total


def compare_bert(args: argparse.Namespace) -> None:
    sets = bert_sets()
    held_out, samples_a_run = sets.val, len(sets.train) // 32 * 32 * args.epochs
    sides = {"trainrun, full head": [], "trainrun, masked_head": [], "Trainer": []}
    results: dict[str, list[tuple[float, float, float, float, float]]] = {side: [] for side in sides}
    duration = [f"max_duration={args.epochs}ep", f"eval_interval={args.epochs}ep"]
    for index in range(args.rounds):
        order = list(sides) if index % 2 == 0 else list(sides)[::-1]
        for side in order:
            out = args.out / "bert" / f"{side.replace(', ', '-')}-round{index + 1}"
            if side == "Trainer":
                shutil.rmtree(out, ignore_errors=True)
                command = [sys.executable, __file__, "--hf-bert-side", "--out", str(out), "--epochs", str(args.epochs)]
                command += ["--seed", str(index + 1)]
                _, user, system = timed(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
                seconds = json.loads((out / "result.json").read_text())["train_seconds"]
                accuracy = masked_accuracy(out / "model", held_out)
                samples = samples_a_run
            else:
                methods = ["algorithms=[masked_head]"] if "masked" in side else []
                metrics, user, system = trainrun([*BERT_COMPANION, *duration, *methods, f"seed={index + 1}"], out)
                accuracy = checked(metrics, out, masked_accuracy(out / "hf_model", held_out), "masked_accuracy")
                seconds, samples = metrics[-1]["train_seconds"], metrics[-1]["samples"]
            results[side].append((accuracy, seconds, samples / seconds, user, system))
    print(
        f"bert: BERT-Tiny masked LM, 128-token packed samples, batch 32, {args.epochs} epochs, fp32, "
        f"{args.rounds} round(s)"
    )
    print("| side | masked-token accuracy | train s | seq/s | user CPU s | system CPU s (medians of rounds) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for side, values in results.items():
        accuracy, seconds, rate, user, system = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"| {side} | {accuracy:.2%} | {seconds:.1f} | {rate:.1f} | {user:.1f} | {system:.1f} |")
    for side, values in results.items():
        print(f"{side}: accuracy by seed: {', '.join(f'{v[0]:.2%}' for v in values)}")
    peer = [v[1] for v in results["Trainer"]]
    for side in ("trainrun, full head", "trainrun, masked_head"):
        print(f"{side}: Trainer's time / trainrun's: {ratio_text(peer, [v[1] for v in results[side]])}")
    print()


# ---------------------------------------------------------------- ResNet against Composer

RESNET_COMPANION = ["data=mnist5k", "model=resnet_small", "progress=false", "eval_interval=1ep"]
METHODS = {  # trainrun's name -> Composer's class (each at trainrun's defaults: peers_composer.py)
    "blurpool": "BlurPool", "channels_last": "ChannelsLast", "label_smoothing": "LabelSmoothing",
    "progressive_resizing": "ProgressiveResizing", "colout": "ColOut",
}  # fmt: skip


def composer_python(env: Path) -> Path:
    """The side environment's Python, made with ``pip install mosaicml`` on first use (minutes:
    Composer brings its own torch)."""
    python = env / "bin" / "python"
    if not (python.exists() and subprocess.run([python, "-c", "import composer"], capture_output=True).returncode == 0):
        print(
            f"making {env}: python -m venv, pip install mosaicml (once; several minutes)", file=sys.stderr, flush=True
        )
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "mosaicml"], check=True)
    return python


def resnet_inputs(out: Path) -> tuple[Path, Path, tuple[torch.Tensor, torch.Tensor]]:
    """MNIST-5k's training and held-out images as trainrun splits them (an .npz), the initial
    weights trainrun's resnet_small draws at the run's seed, and the held-out tensors."""
    from trainrun.config import compose
    from trainrun.core.seeding import seed_everything
    from trainrun.data.builtin import load_arrays, split_indices
    from trainrun.models.build import build_model
    from trainrun.validation import validate

    config = validate(compose(RESNET_COMPANION), files=False)
    images, labels = load_arrays("mnist5k")
    train, val = split_indices(len(labels), config.data.val_fraction, config.data.split_seed)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": images[train],
        "train_labels": labels[train],
        "val_images": images[val],
        "val_labels": labels[val],
    }
    np.savez(out / "mnist5k.npz", **{key: value.numpy() for key, value in arrays.items()})
    seed_everything(config.seed)
    torch.save(build_model(config.model).state_dict(), out / "initial.pt")
    return out / "mnist5k.npz", out / "initial.pt", (images[val], labels[val])


def first_reaching(rows: list[dict], accuracy: float, key: str) -> float | None:
    return next((row["train_seconds"] for row in rows if row[key] >= accuracy), None)


def compare_resnet(args: argparse.Namespace) -> None:
    from peers_composer import top1

    from trainrun.config import compose
    from trainrun.core.checkpoint import directory, list_checkpoints, load_checkpoint
    from trainrun.models.build import build_model
    from trainrun.validation import validate

    python = composer_python(args.composer_env)
    data, weights, held_out = resnet_inputs(args.out / "resnet")
    results: dict[tuple[str, str], list[tuple[float, float | None, float]]] = {}  # -> (s, s to target, accuracy)
    for index in range(args.rounds):
        for methods in ([], list(METHODS)):
            label = "bare" if not methods else "five methods"
            for side in ("composer", "trainrun") if index % 2 == 0 else ("trainrun", "composer"):
                out = args.out / "resnet" / f"{side}-{label.replace(' ', '_')}-round{index + 1}"
                if side == "composer":
                    out.mkdir(parents=True, exist_ok=True)
                    command = [
                        str(python),
                        str(BENCH / "peers_composer.py"),
                        "--data",
                        str(data),
                        "--weights",
                        str(weights),
                    ]
                    command += ["--result", str(out / "rows.json"), "--epochs", str(args.resnet_epochs), "--methods"]
                    timed([*command, *(METHODS[m] for m in methods)])
                    rows, key = json.loads((out / "rows.json").read_text()), "accuracy"
                else:
                    algorithms = [f"algorithms=[{','.join(methods)}]"] if methods else []
                    rows, _, _ = trainrun([*RESNET_COMPANION, f"max_duration={args.resnet_epochs}ep", *algorithms], out)
                    key = "top1"
                    if not methods:  # the run's own evaluation against the shared evaluator
                        model = build_model(validate(compose(RESNET_COMPANION), files=False).model)
                        model.load_state_dict(load_checkpoint(list_checkpoints(directory(out))[-1])["model"])
                        checked(rows, out, top1(model, *held_out), "top1")
                reached = first_reaching(rows, args.target, key)
                results.setdefault((label, side), []).append((rows[-1]["train_seconds"], reached, rows[-1][key]))
    print(
        f"resnet: resnet_small on MNIST-5k, {args.resnet_epochs} epochs, batch 64, SGDW 0.2, {args.rounds} round(s); "
        f"five methods: {', '.join(METHODS)}"
    )
    print(f"| run | side | final top-1 | train s | s to {args.target:.0%} (medians of rounds) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (label, side), values in results.items():
        reached = [v[1] for v in values if v[1] is not None]
        to_target = f"{statistics.median(reached):.1f}" if len(reached) == len(values) else "not reached"
        accuracy, seconds = statistics.median(v[2] for v in values), statistics.median(v[0] for v in values)
        print(f"| {label} | {side} | {accuracy:.2%} | {seconds:.1f} | {to_target} |")
    for label in ("bare", "five methods"):
        peer, ours = results[(label, "composer")], results[(label, "trainrun")]
        print(f"{label}: total time, Composer's / trainrun's: {ratio_text([v[0] for v in peer], [v[0] for v in ours])}")
        if all(v[1] is not None for v in peer + ours):
            print(
                f"{label}: time to {args.target:.0%}, Composer's / trainrun's: "
                f"{ratio_text([v[1] for v in peer], [v[1] for v in ours])}"
            )
    profile_resnet(args, python, data, weights)
    print()


def profile_resnet(args: argparse.Namespace, python: Path, data: Path, weights: Path) -> None:
    """Where a bare step's time goes: trainrun's run's phases (its steps.jsonl), the same training as
    a hand-written loop on trainrun's torch and on Composer's, and each trainer's mean step."""
    rows = {}
    for label, interpreter in (
        ("hand loop, trainrun's torch", sys.executable),
        ("hand loop, Composer's torch", python),
    ):
        result = args.out / "resnet" / f"profile-{len(rows)}.json"
        command = [str(interpreter), str(BENCH / "peers_composer.py"), "--data", str(data), "--weights", str(weights)]
        timed([*command, "--result", str(result), "--profile-steps", str(args.profile_steps)])
        profile = json.loads(result.read_text())
        rows[f"{label} ({profile.pop('torch')})"] = profile
    steps = [json.loads(line) for line in (args.out / "resnet" / "trainrun-bare-round1" / "steps.jsonl").open()]
    phases = {key: 1000 * statistics.median(row[key] for row in warm(steps)) for key in steps[0] if key != "step"}
    rows["trainrun (its steps.jsonl)"] = {"data": phases.pop("data"), "forward": phases.pop("forward"),
        "backward": phases.pop("backward"), "optimizer": phases.pop("optimizer"),
        "other": sum(v for k, v in phases.items() if k not in ("eval", "checkpoint"))}  # fmt: skip
    print("| bare step, median ms | data | forward | backward | optimizer | other | step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, profile in rows.items():
        cells = " | ".join(f"{profile.get(k, 0.0):.1f}" for k in ("data", "forward", "backward", "optimizer", "other"))
        print(f"| {label} | {cells} | {sum(profile.values()):.1f} |")
    batches = args.resnet_epochs * (len(np.load(data)["train_labels"]) // 64)
    for side in ("trainrun", "composer"):
        seconds = statistics.median(
            json.loads((path / "rows.json").read_text())[-1]["train_seconds"] if side == "composer"
            else [json.loads(line) for line in (path / "metrics.jsonl").open()][-1]["train_seconds"]
            for path in sorted((args.out / "resnet").glob(f"{side}-bare-round*"))
        )  # fmt: skip
        print(f"{side}: mean step over the run (train s / {batches} steps): {1000 * seconds / batches:.1f} ms")


def main() -> None:
    from peers_gpu import BERT_TARGET, SECTIONS, run_sections  # the GPU sections (they import peers_shared only)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["gpt", "bert", "llama", "resnet"], help="sections (default: all)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the sections at GPU size")
    parser.add_argument("--scale", choices=["companion", "gpu", "tiny"], help="tiny: the GPU sections on a CPU")
    parser.add_argument("--section-limit", type=float, default=130, help="GPU sections: seconds each")
    parser.add_argument("--bert-target", type=float, default=BERT_TARGET, help="GPU bert: masked accuracy timed to")
    parser.add_argument("--nanogpt", type=Path, help="a checkout of nanoGPT (its train.py, model.py, configurator.py)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400, help="gpt: optimizer steps of every run")
    parser.add_argument("--large-steps", type=int, default=8, help="gpt: steps at gpt125's shape")
    parser.add_argument("--rates", type=float, nargs="+", default=[6e-4, 2e-3, 6e-3, 1e-2], help="gpt: the sweep")
    parser.add_argument("--epochs", type=int, default=3, help="bert: epochs of every run")
    parser.add_argument("--resnet-epochs", type=int, default=6)
    parser.add_argument("--profile-steps", type=int, default=60, help="resnet: steps of each hand-written loop")
    parser.add_argument("--target", type=float, default=0.97, help="resnet: the top-1 accuracy timed to")
    parser.add_argument("--composer-env", type=Path, default=Path("/tmp/peers-composer-env"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/peers"))
    parser.add_argument("--hf-bert-side", action="store_true", help=argparse.SUPPRESS)  # the Trainer's own process
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)  # the Trainer's seed
    args = parser.parse_args()
    if args.hf_bert_side:
        hf_bert_side(args.out, args.epochs, args.seed)
        return
    if args.nanogpt is not None and not (args.nanogpt / "train.py").is_file():
        sys.exit(f"bench/peers.py: --nanogpt {args.nanogpt}: no train.py there (a nanoGPT checkout?)")
    args.nanogpt = args.nanogpt.resolve() if args.nanogpt else None  # nanoGPT runs in a folder of its own
    args.scale = args.scale or ("gpu" if args.device == "cuda" else "companion")
    if args.scale != "companion":  # the GPU sections (peers_gpu.py), at GPU size or tiny on a CPU
        args.only = args.only or list(SECTIONS)
        run_sections(args)
        return
    args.only = args.only or ["gpt", "bert", "resnet"]
    if "llama" in args.only:
        sys.exit("bench/peers.py: --only llama: a GPU section (--device cuda, or --scale tiny)")
    started = time.perf_counter()
    for name in args.only:
        {"gpt": compare_gpt, "bert": compare_bert, "resnet": compare_resnet}[name](args)
    print(f"bench/peers.py: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
