"""The GPT recipes' CPU companions: time to the baseline's validation loss, side by side.

Each published GPT recipe (``gpt125``: Composer's baseline; ``gpt125_mosaic``: + ALiBi and
sequence-length warmup; ``gpt_speedrun``: Muon, rotary, QK-norm, ReLU², untied head, soft-cap,
value embeddings, document mask, warmup-stable-decay) runs as a user runs it (``python -m trainrun
recipe=...``, its own process) at a size this CPU trains in minutes: ``model=gpt_tiny`` (2 heads;
the speedrun's value embedding and attention window shrunk alike), the built-in corpus as a token
stream, 16 windows of 64 tokens a step, fp32, each recipe's schedule shrunk to ``--steps`` steps by
``scale_schedule_ratio`` (warmups, cooldowns and Muon's momentum warmup with it), evaluated every
``--eval-every`` steps. Rounds alternate the recipes' order; the best round of each counts.

Printed per recipe: the final validation loss, the training seconds to the loss the baseline ends
at (the first evaluation at or below it; evaluation time excluded) and that time over the
baseline's (below 1: faster to the same quality). The runs stay under ``--out``, so that
``trainrun report OUT/*/round1`` draws their trade-off plots.

    .venv/bin/python bench/gpt.py [--steps 400] [--rounds 1] [--out /tmp/gpt-bench] [--plot docs/gpt_companion.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED_STEPS = {"gpt125": 14_000, "gpt125_mosaic": 14_000, "gpt_speedrun": 1_770}
COMPANION = [
    "data=stdlib_stream", "model=gpt_tiny", "model.gpt.heads=2", "data.text.max_seq_len=64", "train_batch_size=16",
    "eval_batch_size=32", "device_train_microbatch_size=null", "data.num_workers=1", "precision=fp32",
    "progress=false",
]  # fmt: skip
# the speedrun's shape at gpt_tiny's size: one value-embedding table for two blocks (the record: 3
# for 12); the attention window growing over 64-token windows as the record's over 1,024 (x 1/16)
SHRUNK = {
    "gpt_speedrun": [
        "model.gpt.value_embeddings=1",
        "algorithms.window_warmup.start=8",
        "algorithms.window_warmup.end=112",
        "algorithms.window_warmup.multiple=8",
    ]
}


def run(recipe: str, steps: int, eval_every: int, run_dir: Path) -> list[dict]:
    """One companion run of ``recipe`` into ``run_dir`` (emptied first: it is this bench's); its
    evaluations (metrics.jsonl rows)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    ratio = steps / PUBLISHED_STEPS[recipe]
    args = [f"recipe={recipe}", *COMPANION, *SHRUNK.get(recipe, []), f"scale_schedule_ratio={ratio:.6f}"]
    args.append(f"eval_interval={eval_every}ba")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "trainrun", *args, f"hydra.run.dir={run_dir}"], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"bench/gpt.py: recipe {recipe} failed: {result.stderr.strip().splitlines()[-1]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def seconds_to(rows: list[dict], loss: float) -> float | None:
    """Training seconds at the first evaluation at or below ``loss``; None if never."""
    return next((row["train_seconds"] for row in rows if row["eval_loss"] <= loss), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpt-bench"))
    parser.add_argument("--plot", type=Path, help="also draw validation loss against training seconds to this PNG")
    args = parser.parse_args()
    recipes = list(PUBLISHED_STEPS)
    results: dict[str, list[list[dict]]] = {recipe: [] for recipe in recipes}
    for index in range(args.rounds):
        order = recipes if index % 2 == 0 else recipes[::-1]
        for recipe in order:
            rows = run(recipe, args.steps, args.eval_every, args.out / recipe / f"round{index + 1}")
            results[recipe].append(rows)
    target = min(rounds[-1]["eval_loss"] for rounds in results["gpt125"])  # the baseline's best end
    base = min(seconds_to(rows, target) for rows in results["gpt125"])
    print(
        f"GPT recipes' CPU companions: gpt_tiny, 16 x 64 tokens a step, {args.steps} steps, fp32, "
        f"best of {args.rounds} round(s); target = the baseline's final validation loss {target:.4f}"
    )
    print("| recipe | final loss (best) | train s | s to target | vs gpt125 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for recipe, rounds in results.items():
        final = min(rows[-1]["eval_loss"] for rows in rounds)
        seconds = min(rows[-1]["train_seconds"] for rows in rounds)
        reached = [t for t in (seconds_to(rows, target) for rows in rounds) if t is not None]
        to_target = f"{min(reached):.1f}" if reached else "not reached"
        ratio = f"{min(reached) / base:.2f}x" if reached else "–"
        print(f"| {recipe} | {final:.4f} | {seconds:.1f} | {to_target} | {ratio} |")
    if args.plot:
        plot(results, target, args.plot)


def plot(results: dict[str, list[list[dict]]], target: float, path: Path) -> None:
    """Each recipe's fastest round: validation loss against training seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for recipe, rounds in results.items():
        rows = min(rounds, key=lambda rows: rows[-1]["train_seconds"])
        axes.plot([r["train_seconds"] for r in rows], [r["eval_loss"] for r in rows], marker=".", label=recipe)
    axes.axhline(target, color="grey", linestyle=":", label=f"baseline's final loss {target:.3f}")
    axes.set(xlabel="training seconds (2-core CPU)", ylabel="validation loss (lower is better)")
    axes.set_title("GPT recipes' CPU companions (gpt_tiny, 400 steps)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
