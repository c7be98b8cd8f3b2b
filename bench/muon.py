"""Muon's step on a GPT's hidden matrices: torch.optim.Muon (every matrix on its own, the fused q, k,
v as one) against trainrun's MatrixMuon (q, k, v as three, Newton-Schulz batched over same-shape
matrices) in one process, and MatrixMuon divided between two gloo ranks (each orthogonalising half
the matrices, then an all-gather). Every process has ``--threads`` threads, so two ranks have twice
one process's cores, as two GPUs have twice one GPU's: the 2-rank row is what a rank's step costs
once the work is shared (on a machine of at least 2 x ``--threads`` cores). Gradients are drawn
once (the same on every rank, as DDP leaves them); the time is the optimizer step alone, the best
of ``--rounds`` rounds of ``--steps`` steps.

    .venv/bin/python bench/muon.py [--width 384] [--layers 4] [--steps 5] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainrun.launch import free_port
from trainrun.models.gpt import GPT
from trainrun.optim.muon import MatrixMuon, parameter_roles
from trainrun.schema import GPTConfig


def matrices(args: argparse.Namespace) -> tuple[GPT, list[torch.nn.Parameter]]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=args.layers, width=args.width, heads=args.width // 64, max_seq_len=64), 512)
    hidden = [param for _, param in parameter_roles(model, ["head"])["matrices"]]
    generator = torch.Generator().manual_seed(1)
    for param in hidden:
        param.grad = torch.randn(param.shape, generator=generator)
    return model, hidden


def seconds_per_step(optimizer: torch.optim.Optimizer, args: argparse.Namespace) -> float:
    optimizer.step()  # warm-up: the momentum buffers
    best = float("inf")
    for _ in range(args.rounds):
        if dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            optimizer.step()
        best = min(best, (time.perf_counter() - start) / args.steps)
    return best


def build(name: str, model: GPT, hidden: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    settings = {"momentum": 0.95, "nesterov": True, "weight_decay": 0.0}
    if name == "torch.optim.Muon":
        return torch.optim.Muon(hidden, lr=0.05, **settings)
    named = dict(model.named_parameters())
    stacked = {named[name]: count for name, count in model.stacked_matrices().items()}
    return MatrixMuon([{"params": hidden, "lr": 0.05}], stacked, **settings)


def ranked(rank: int, port: int, args: argparse.Namespace, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    model, hidden = matrices(args)
    seconds = seconds_per_step(build("MatrixMuon", model, hidden), args)
    if rank == 0:
        results["MatrixMuon, 2 ranks"] = seconds
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="threads of each process")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = mp.Manager().dict()
    for name in ("torch.optim.Muon", "MatrixMuon"):
        model, hidden = matrices(args)
        results[name if name != "MatrixMuon" else "MatrixMuon, 1 process"] = seconds_per_step(
            build(name, model, hidden), args
        )
    mp.spawn(ranked, args=(free_port(), args, results), nprocs=2)
    model, hidden = matrices(args)
    print(f"GPT width {args.width}, {args.layers} blocks: {len(hidden)} hidden matrices")
    print(f"{args.threads} thread(s) a process; torch {torch.__version__}")
    print("| optimizer | ms / step (best) | torch.optim.Muon's time / this |")
    print("| --- | --- | --- |")
    reference = results["torch.optim.Muon"]
    for name in ("torch.optim.Muon", "MatrixMuon, 1 process", "MatrixMuon, 2 ranks"):
        print(f"| {name} | {results[name] * 1e3:.1f} | {reference / results[name]:.2f} |")


if __name__ == "__main__":
    main()
