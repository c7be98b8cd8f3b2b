"""The loss over a large vocabulary: host memory and time of the plain float32 cross-entropy against
trainrun's chunked one, from bfloat16 logits as a model under ``precision=bf16`` returns them.

Each variant runs in a process of its own (a fresh peak): it makes the (positions, vocabulary)
bfloat16 logits, then takes the loss and its gradient, ``--rounds`` times. What it adds above the
logits is its peak resident memory less the resident memory before the first loss (Linux's
``VmHWM`` - ``VmRSS``), i.e. the loss's own working memory, the logits' gradient included.

- ``float32 copy``: what trainrun ran before: the model's ``.float()`` of the whole logits, then
  ``F.cross_entropy`` (which keeps the float32 log-probabilities for the backward);
- ``chunked``: :func:`trainrun.tasks.losses.summed_cross_entropy`: a chunk of positions at a time
  in float32, each chunk's log-probabilities recomputed in the backward.

    .venv/bin/python bench/logits.py [--positions 2048] [--vocab 128256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from trainrun.tasks.losses import summed_cross_entropy


def resident_mb() -> tuple[float, float]:
    """This process's resident and peak resident memory, MB (Linux)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def float32_copy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets)


def chunked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return summed_cross_entropy(logits, targets) / len(targets)


VARIANTS = {"float32 copy": float32_copy, "chunked": chunked}


def run(name: str, positions: int, vocab: int, rounds: int, results) -> None:
    torch.manual_seed(0)
    logits = torch.randn(positions, vocab, dtype=torch.bfloat16).requires_grad_()
    targets = torch.randint(0, vocab, (positions,))
    before, _ = resident_mb()
    seconds, losses = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        loss = VARIANTS[name](logits, targets)
        loss.backward()
        seconds.append(time.perf_counter() - start)
        losses.append(float(loss))
        logits.grad = None
    _, peak = resident_mb()
    results[name] = (peak - before, min(seconds), losses[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    results = context.Manager().dict()
    for name in VARIANTS:
        process = context.Process(target=run, args=(name, args.positions, args.vocab, args.rounds, results))
        process.start()
        process.join()
        if process.exitcode:
            raise SystemExit(f"{name}: its process ended with exit code {process.exitcode}")
    logits_mb = args.positions * args.vocab * 2 / 2**20
    print(f"{args.positions} positions x {args.vocab} tokens: bfloat16 logits {logits_mb:.0f} MB")
    print(f"torch {torch.__version__}")
    print("| loss | added memory (MB) | x the logits | s / loss + backward (best) | loss |")
    print("| --- | --- | --- | --- | --- |")
    for name, (added, seconds, loss) in results.items():
        print(f"| {name} | {added:.0f} | {added / logits_mb:.2f} | {seconds:.3f} | {loss:.6f} |")
    reference, ours = results["float32 copy"][0], results["chunked"][0]
    print(f"chunked / float32 copy, added memory: {ours / reference:.2f}x")


if __name__ == "__main__":
    main()
