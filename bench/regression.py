"""CPU speed regressions: the documented CPU companions at this checkout and at an earlier commit.

Each job runs as a user runs it (``python -m trainrun ...``, its own process), once per round at
HEAD and once at BASE (a git worktree of that commit, made once under ``--work``), alternating
which goes first, so drift in the machine's speed hits both. The figure is the run's own training
time (``summary.json``'s ``train_seconds``: evaluation and checkpoints excluded); the best round
of each side is compared, since noise from other work only ever slows a round down. Printed per
job: both times, HEAD/BASE speed (above 1: HEAD is faster) and the spread of the rounds.

A job whose command BASE does not know (a key renamed since, a task it did not have) is reported
as not comparable, with BASE's one-line error.

    .venv/bin/python bench/regression.py BASE [--rounds 3] [--jobs digits mnist_mild bert_tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the documented CPU companions (make run's default job, the mild recipe on MNIST, BERT-Tiny)
JOBS: dict[str, list[str]] = {
    "digits": ["progress=false"],
    "mnist_mild": [
        "recipe=mild", "data=mnist5k", "model=resnet_small", "data.resolution=28", "data.eval_resolution=28",
        "train_batch_size=256", "max_duration=6ep", "precision=fp32", "scheduler.t_warmup=1ep",
        "algorithms.ema.half_life=10ba", "algorithms.ema.update_interval=2ba", "progress=false",
    ],
    "bert_tiny": [
        "task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "data.text.packing=pack", "optimizer=adamw",
        "optimizer.lr=2e-3", "algorithms=[masked_head]", "train_batch_size=32", "max_duration=3ep", "progress=false",
    ],
}  # fmt: skip


def checkout(commit: str, work: Path) -> Path:
    """A worktree of ``commit`` under ``work``, made once."""
    sha = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True)
    tree = work / sha.stdout.strip()[:12]
    if not tree.is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), commit], cwd=ROOT, check=True)
    return tree


def train_seconds(source: Path, args: list[str], run_dir: Path) -> tuple[float | None, str]:
    """The training seconds of one run of ``trainrun ARGS`` from the code in ``source``, or None
    and the run's last error line."""
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "trainrun", *args, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        return None, lines[-1] if lines else f"exit {result.returncode}"
    return json.loads((run_dir / "summary.json").read_text())["train_seconds"], ""


def spread(values: list[float]) -> str:
    return f"{statistics.pstdev(values) / statistics.mean(values):.1%}" if len(values) > 1 else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "trainrun-regression")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    sides = {"HEAD": ROOT, "BASE": checkout(args.base, args.work)}
    print(f"BASE = {args.base} ({sides['BASE'].name}), {args.rounds} rounds, best round of each side")
    print(f"{'job':<12} {'HEAD s':>8} {'BASE s':>8} {'HEAD/BASE speed':>16} {'spread H/B':>12}")
    for job in args.jobs:
        times: dict[str, list[float]] = {"HEAD": [], "BASE": []}
        refused = ""
        for round_ in range(args.rounds):
            order = ["HEAD", "BASE"] if round_ % 2 == 0 else ["BASE", "HEAD"]
            for side in order:
                with tempfile.TemporaryDirectory(dir=args.work) as scratch:
                    seconds, error = train_seconds(sides[side], JOBS[job], Path(scratch) / "run")
                if seconds is None:
                    refused = f"{side}: {error}"
                    break
                times[side].append(seconds)
            if refused:
                break
        if refused:
            print(f"{job:<12} not comparable ({refused})")
            continue
        head, base = min(times["HEAD"]), min(times["BASE"])
        spreads = f"{spread(times['HEAD'])}/{spread(times['BASE'])}"
        print(f"{job:<12} {head:8.2f} {base:8.2f} {base / head:15.3f}x {spreads:>12}", flush=True)


if __name__ == "__main__":
    main()
