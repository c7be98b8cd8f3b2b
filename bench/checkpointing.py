"""Activation checkpointing's host cost: the time a training step spends recomputing, per policy.

One process builds ``--model`` (a Llama preset) and times forward + backward passes on random tokens
under each variant, rounds alternating, the first pass of each (compilation) left out:

- ``none``: nothing recomputed (the reference);
- ``selective, eager, RNG kept``: what ``parallel.activation_checkpointing=selective`` ran before:
  torch's selective-checkpoint dispatch mode intercepting every op of each block's forward and of its
  recompute, and the forward's RNG state saved and restored for a model that draws no random number;
- ``selective, eager``: the same without the RNG state (what a model without dropout runs now);
- ``selective, compiled``: each block compiled with its checkpoint (``compile=true``): the policy is
  applied when the graph is traced, nothing intercepts ops at run time (``--compile``: inductor
  compiles for a minute or so on a CPU);
- ``full, eager``: each block's forward run twice.

A small model on a few tokens is host-bound, which is what a GPU step of a larger one is at the
host: the milliseconds a policy adds over ``none`` are its host cost there.

    .venv/bin/python bench/checkpointing.py [--model llama_tiny] [--batch 1] [--seq 64] [--steps 10]
        [--rounds 3] [--compile]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
from sharding import llama_config

from trainrun.core import compiled, parallel
from trainrun.models.llama import Llama
from trainrun.tasks.causal_lm import next_token_cross_entropy

VOCAB = 8192


def build(preset: str, mode: str, keeps_rng_state: bool, compiles: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = Llama(llama_config(preset), VOCAB)
    if mode != "none":
        for block in model.blocks:
            block.forward = parallel.checkpointed(block.forward, mode == "selective", keeps_rng_state)
    if compiles:
        compiled.compile_model(model, print)
    return model


def step_time(model: torch.nn.Module, tokens: torch.Tensor, steps: int) -> float:
    """Seconds per forward + backward, averaged over ``steps`` passes."""
    start = time.perf_counter()
    for _ in range(steps):
        next_token_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama_tiny")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time the compiled selective policy")
    args = parser.parse_args()
    variants: dict[str, Callable[[], torch.nn.Module]] = {
        "none": functools.partial(build, args.model, "none", False, False),
        "selective, eager, RNG kept": functools.partial(build, args.model, "selective", True, False),
        "selective, eager": functools.partial(build, args.model, "selective", False, False),
        "full, eager": functools.partial(build, args.model, "full", False, False),
    }
    if args.compile:
        variants["none, compiled"] = functools.partial(build, args.model, "none", False, True)
        variants["selective, compiled"] = functools.partial(build, args.model, "selective", False, True)
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq + 1))
    models = {name: make() for name, make in variants.items()}
    for model in models.values():
        step_time(model, tokens, 2)  # warm-up: compilation, allocator
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(args.rounds):
        order = list(models) if round_ % 2 == 0 else list(reversed(models))
        for name in order:
            times[name].append(step_time(models[name], tokens, args.steps))
    threads = torch.get_num_threads()
    print(f"{args.model}, batch {args.batch} x {args.seq} tokens, {threads} threads, torch {torch.__version__}")
    print("| policy | ms / step (median) | over none | every round (ms) |")
    print("| --- | --- | --- | --- |")
    reference = statistics.median(times["none"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        rounds = ", ".join(f"{s * 1e3:.2f}" for s in seconds)
        over = f"{(median - reference) * 1e3:+.2f} ms ({median / reference:.2f}x)"
        print(f"| {name} | {median * 1e3:.2f} | {over} | {rounds} |")


if __name__ == "__main__":
    main()
