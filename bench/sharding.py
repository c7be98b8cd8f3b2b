"""Sharded training: a rank's memory under FSDP2 against DDP, activation checkpointing's saving,
and (on a GPU) a Llama's tokens per second and MFU under DDP and FSDP2, in bf16 and fp8.

``memory`` (the default; CPU, gloo): ``--ranks`` processes each build ``--model`` the way a run does
(``parallel.prepare``: under fsdp on the meta device, materialised shard by shard), take one AdamW
step on random tokens, and count the bytes each rank holds of weights, gradients and optimizer
state (local shards under FSDP2); the ratio FSDP2 / DDP is printed (ideally 1 / ranks). Then the
bytes autograd keeps from one forward pass for the backward under ``parallel.activation_checkpointing``
none, selective and full (one process).

``speed`` (a GPU): one process, a process group of one, ``--model`` (default ``llama3_1b``) under
DDP's path (the model whole) and under FSDP2 (``fully_shard`` per block and on the root, a mesh of
one GPU: its gathers and reduce-scatters with nothing to exchange), for each of ``--precisions``
(bf16; fp8 through torchao where the GPU has it), eager or compiled (``--compile``, as ``compile=true``:
fp8 is slower than bf16 without it); tokens per second and MFU,
with model FLOPs per token ``6·N + 12·L·D·T`` (N the blocks' and head's weights, L layers, D width,
T tokens a window; nanoGPT's estimate) against the bf16 peak of ``gpu_throughput.py``'s table.

    .venv/bin/python bench/sharding.py [--ranks 2] [--model llama_tiny]
    python bench/sharding.py speed [--model llama3_1b] [--batch 2] [--seq 4096] [--precisions bf16 fp8] [--compile]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gpu_throughput import peak_tflops

from trainrun.config import compose
from trainrun.core import parallel
from trainrun.core.precision import resolve_precision
from trainrun.fields import choices_of
from trainrun.models.llama import Llama
from trainrun.schema import LlamaConfig, ParallelConfig
from trainrun.tasks.causal_lm import next_token_cross_entropy
from trainrun.validation import validate

VOCAB = 8192  # the built-in corpus's vocabulary (Llama 3's 128,256 with --vocab 128256)
CHECKPOINTING = choices_of(ParallelConfig, "activation_checkpointing")


def llama_config(preset: str) -> LlamaConfig:
    return validate(compose(["task=causal_lm", "data=stdlib_stream", f"model={preset}"]), files=False).model.llama


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def memory_rank(rank: int, ranks: int, port: int, preset: str, vocab: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    config = llama_config(preset)
    for mode in ("ddp", "fsdp"):
        torch.manual_seed(0)
        with torch.device("meta") if mode == "fsdp" else torch.device("cpu"):
            model = Llama(config, vocab)
        model = parallel.prepare(model, parallel.Parallelism(name=mode), None, torch.device("cpu"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        wrapped = parallel.replicate(model, torch.device("cpu"), False) if mode == "ddp" else model
        tokens = torch.randint(0, vocab, (2, 65))
        next_token_cross_entropy(wrapped(tokens[:, :-1]), tokens[:, 1:]).backward()
        optimizer.step()
        results[(mode, rank)] = parallel.held_bytes(model, [optimizer])
        del wrapped, model, optimizer
    dist.destroy_process_group()


def saved_activation_bytes(config: LlamaConfig, vocab: int, mode: str, batch: int, seq: int) -> int:
    """What autograd keeps from one forward pass for the backward, under activation checkpointing ``mode``."""
    torch.manual_seed(0)
    model = Llama(config, vocab)
    parallel.checkpoint_activations(model, parallel.Parallelism(activation_checkpointing=mode))
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 0 if isinstance(tensor, torch.nn.Parameter) else tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(torch.randint(0, vocab, (batch, seq))).logsumexp(-1).mean().backward()
    return saved


def memory(args: argparse.Namespace) -> None:
    results = mp.Manager().dict()
    mp.spawn(memory_rank, args=(args.ranks, free_port(), args.model, args.vocab, results), nprocs=args.ranks)
    print(f"model={args.model}, vocabulary {args.vocab}, {args.ranks} ranks (gloo), one AdamW step: MB held by rank 0")
    print("| parallel | weights | gradients | optimizer state | total | vs ddp |")
    print("|---|---|---|---|---|---|")
    ddp_total = sum(results[("ddp", 0)].values())
    for mode in ("ddp", "fsdp"):
        held = results[(mode, 0)]
        total = sum(held.values())
        cells = " | ".join(f"{held[key] / 1e6:.2f}" for key in ("weights", "gradients", "optimizer"))
        print(f"| {mode} | {cells} | {total / 1e6:.2f} | {total / ddp_total:.3f}x |")
    print(f"\nactivations autograd keeps for the backward: batch {args.batch} x {args.seq} tokens, one process")
    print("| activation_checkpointing | MB | vs none |")
    print("|---|---|---|")
    config = llama_config(args.model)
    sizes = {mode: saved_activation_bytes(config, args.vocab, mode, args.batch, args.seq) for mode in CHECKPOINTING}
    for mode, size in sizes.items():
        print(f"| {mode} | {size / 1e6:.1f} | {size / sizes['none']:.3f}x |")
    if not parallel.SAC_HOOKS:
        print(f"(torch {torch.__version__} keeps selective checkpointing's tensors outside the hooks: not counted)")


def flops_per_token(model: Llama, seq: int) -> float:
    weights = sum(p.numel() for p in model.blocks.parameters()) + model.head.weight.numel()
    return 6 * weights + 12 * model.config.layers * model.config.width * seq


def build_variant(config: LlamaConfig, mode: str, precision, args, device: torch.device):
    """``config``'s Llama as a run builds it under ``mode`` (whole, or sharded over a mesh of one)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(config, args.vocab)
    precision.convert(model)
    if mode == "ddp":  # whole on the device
        model.to_empty(device=device)
        model.initialise()
    settings = parallel.Parallelism(name=mode, activation_checkpointing=args.activation_checkpointing)
    model = parallel.prepare(model, settings, precision.dtype, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    return (torch.compile(model) if args.compile else model), optimizer  # as a run with compile=true


def timed_steps(model, optimizer, precision, tokens: torch.Tensor, steps: int, device: torch.device) -> float:
    """Seconds a step over ``steps`` optimizer steps, after one untimed step (kernels, allocation)."""
    for step in range(steps + 1):
        if step == 1:
            torch.cuda.synchronize() if device.type == "cuda" else None
            started = time.perf_counter()
        with precision.autocast():
            loss = next_token_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize() if device.type == "cuda" else None
    return (time.perf_counter() - started) / steps


def speed(args: argparse.Namespace) -> None:
    """One variant at a time (two 1B models with AdamW's state do not share an 80 GB GPU well)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    config = llama_config(args.model)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    peak = peak_tflops(device, "bf16", args.peak_tflops, False)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    name += ", compiled" if args.compile else ""
    print(f"model={args.model} on {name}: {args.batch} x {args.seq} tokens a step, best of {args.rounds} rounds")
    print("| variant | step ms | tokens/s | model TFLOP/s | MFU (bf16 peak) | peak memory GB |")
    print("|---|---|---|---|---|---|")
    for precision_name in args.precisions:
        try:
            precision, _ = resolve_precision(precision_name, device)
        except Exception as error:  # fp8 where the GPU or torchao lacks it: the refusal, as a run prints it
            print(f"| {precision_name} | {error} |")
            continue
        for mode in ("ddp", "fsdp"):
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            model, optimizer = build_variant(config, mode, precision, args, device)
            seconds = min(
                timed_steps(model, optimizer, precision, tokens, args.steps, device) for _ in range(args.rounds)
            )
            flops = flops_per_token(model, args.seq)
            rate = args.batch * args.seq / seconds
            mfu = f"{rate * flops / 1e12 / peak:.1%}" if peak else "-"
            held = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")
            cells = f"{seconds * 1e3:.1f} | {rate:,.0f} | {rate * flops / 1e12:.1f} | {mfu} | {held:.1f}"
            print(f"| {mode}, {precision_name} | {cells} |", flush=True)
            del model, optimizer
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["memory", "speed"], default="memory")
    parser.add_argument("--model", help="a model preset: llama_tiny (memory), llama3_1b (speed)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=["bf16", "fp8"])
    parser.add_argument("--activation-checkpointing", default="none", choices=CHECKPOINTING)
    parser.add_argument("--peak-tflops", type=float)
    parser.add_argument("--compile", action="store_true", help="speed: torch.compile each variant (fp8 needs it)")
    args = parser.parse_args()
    on_memory = args.what == "memory"
    args.model = args.model or ("llama_tiny" if on_memory else "llama3_1b")
    args.batch = args.batch or (4 if on_memory else 2)
    args.seq = args.seq or (256 if on_memory else 4096)
    memory(args) if on_memory else speed(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
