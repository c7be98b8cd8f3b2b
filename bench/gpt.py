"""The GPT recipes' CPU companions: time to the baseline's validation loss, side by side.

Each published GPT recipe (``gpt125``: Composer's baseline; ``gpt125_mosaic``: + ALiBi and
sequence-length warmup; ``gpt_speedrun``: Muon, rotary, QK-norm, ReLU², untied head, soft-cap,
value embeddings, document mask, warmup-stable-decay) runs as a user runs it (``python -m trainrun
recipe=...``, its own process) at a size this CPU trains in minutes: ``model=gpt_tiny`` (2 heads;
the speedrun's value embedding and attention window shrunk alike), the built-in corpus as a token
stream, 16 windows of 64 tokens a step, fp32, each recipe's schedule shrunk to ``--steps`` steps by
``scale_schedule_ratio`` (warmups, cooldowns and Muon's momentum warmup with it), evaluated every
``--eval-every`` steps. Rounds alternate the runs' order; the best round of each counts.

The baseline is tuned for this size: ``gpt125`` runs at its published learning rate and at every
other rate of ``--rates``, and the one ending at the lowest validation loss is the baseline the
others are timed against; the published-rate run stays beside it. Printed per run: the final
validation loss, the training seconds to the tuned baseline's final loss (the first evaluation at
or below it; evaluation time excluded), that time over the tuned baseline's and, the same way, over
the published-rate run's (below 1: faster to the same quality). The runs stay under ``--out``, so
that ``trainrun report OUT/*/round1`` draws their trade-off plots.

    .venv/bin/python bench/gpt.py [--steps 400] [--rounds 1] [--rates 6e-4 2e-3 6e-3 1e-2] [--out /tmp/gpt-bench]
        [--plot docs/gpt_companion.png]
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
    "eval_batch_size=32", "device_train_microbatch_size=null", "data.num_workers=0", "precision=fp32",
    "progress=false", "export=false",
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


def schedule_ratio(recipe: str, steps: int) -> str:
    """The ``scale_schedule_ratio`` argument that shrinks ``recipe``'s run to ``steps`` steps
    (trainrun truncates scaled times to whole steps, so half a step more lands on ``steps``)."""
    return f"scale_schedule_ratio={(steps + 0.5) / PUBLISHED_STEPS[recipe]:.8f}"


def run(recipe: str, steps: int, eval_every: int, run_dir: Path, extra: list[str]) -> list[dict]:
    """One companion run of ``recipe`` (and ``extra`` arguments) into ``run_dir`` (emptied first: it
    is this bench's); its evaluations (metrics.jsonl rows)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    args = [f"recipe={recipe}", *COMPANION, *SHRUNK.get(recipe, []), schedule_ratio(recipe, steps), *extra]
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


def published_rate() -> float:
    """recipe=gpt125's learning rate, as the recipe states it."""
    from trainrun.config import compose

    return float(compose(["recipe=gpt125"]).optimizer.lr)


def run_list(rates: list[float]) -> dict[str, tuple[str, list[str]]]:
    """Each run's label -> (recipe, its extra arguments): gpt125 at its published rate and at every
    other rate of the sweep, then the two recipes it is the baseline of."""
    published = published_rate()
    runs = {"gpt125": ("gpt125", [])}
    runs |= {f"gpt125 lr {rate:g}": ("gpt125", [f"optimizer.lr={rate}"]) for rate in rates if rate != published}
    return runs | {"gpt125_mosaic": ("gpt125_mosaic", []), "gpt_speedrun": ("gpt_speedrun", [])}


def tuned_baseline(runs: dict[str, tuple[str, list[str]]], final: dict[str, float]) -> str:
    """The label of the gpt125 run (of the rate sweep) with the lowest final validation loss."""
    return min((label for label in runs if runs[label][0] == "gpt125"), key=final.get)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rates", type=float, nargs="*", default=[6e-4, 2e-3, 6e-3, 1e-2], help="gpt125's sweep")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpt-bench"))
    parser.add_argument("--plot", type=Path, help="also draw validation loss against training seconds to this PNG")
    args = parser.parse_args()
    runs = run_list(args.rates)
    results: dict[str, list[list[dict]]] = {label: [] for label in runs}
    for index in range(args.rounds):
        for label in list(runs) if index % 2 == 0 else list(runs)[::-1]:
            recipe, extra = runs[label]
            folder = args.out / label.replace(" lr ", "-lr") / f"round{index + 1}"
            results[label].append(run(recipe, args.steps, args.eval_every, folder, extra))
    final = {label: min(rows[-1]["eval_loss"] for rows in rounds) for label, rounds in results.items()}
    tuned = tuned_baseline(runs, final)
    print(
        f"GPT recipes' CPU companions: gpt_tiny, 16 x 64 tokens a step, {args.steps} steps, fp32, best of "
        f"{args.rounds} round(s); gpt125 swept over learning rates {', '.join(f'{r:g}' for r in args.rates)} "
        f"(published: {published_rate():g})"
    )
    print(f"tuned baseline: {tuned} (final validation loss {final[tuned]:.4f})")
    print("| run | final loss (best) | train s | s to the tuned baseline's loss | vs tuned | vs published-rate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base = {
        name: min(filter(None, (seconds_to(rows, final[name]) for rows in results[name]))) for name in (tuned, "gpt125")
    }
    for label, rounds in results.items():
        seconds = min(rows[-1]["train_seconds"] for rows in rounds)
        cells = []
        for name in (tuned, "gpt125"):
            reached = [t for t in (seconds_to(rows, final[name]) for rows in rounds) if t is not None]
            cells.append(
                (f"{min(reached):.1f}", f"{min(reached) / base[name]:.2f}x") if reached else ("not reached", "–")
            )
        print(f"| {label} | {final[label]:.4f} | {seconds:.1f} | {cells[0][0]} | {cells[0][1]} | {cells[1][1]} |")
    if args.plot:
        plot({label: results[label] for label in (tuned, "gpt125_mosaic", "gpt_speedrun")}, final[tuned], args.plot)


def plot(results: dict[str, list[list[dict]]], target: float, path: Path) -> None:
    """Each recipe's fastest round: validation loss against training seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for recipe, rounds in results.items():
        rows = min(rounds, key=lambda rows: rows[-1]["train_seconds"])
        axes.plot([r["train_seconds"] for r in rows], [r["eval_loss"] for r in rows], marker=".", label=recipe)
    axes.axhline(target, color="grey", linestyle=":", label=f"tuned baseline's final loss {target:.3f}")
    axes.set(xlabel="training seconds (2-core CPU)", ylabel="validation loss (lower is better)")
    axes.set_title("GPT recipes' CPU companions (gpt_tiny, 400 steps)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
