"""GPT training step: tokens per second, model FLOPs per token and MFU, for AdamW, Muon and a document mask.

One optimizer step (forward, next-token loss, backward, optimizer) of trainrun's GPT on windows of
the built-in corpus's token stream, ``--batch`` windows of ``--seq`` tokens. Variants run in
alternating rounds on the same batches, each on its own copy of the same initial model, so drift
in machine speed hits all of them; the best round of each is compared with the first:

- ``adamw``: the plain causal model (SDPA ``is_causal``), torch's AdamW at gpt125's 6e-4;
- ``muon``: the same model under ``optimizer=muon`` (torch.optim.Muon on the hidden matrices,
  Adam on the rest, the speedrun's rates): Muon's Newton–Schulz step against AdamW's;
- ``adamw, document mask``: ``model.gpt.document_mask=true`` (FlexAttention's block mask on a
  GPU, compiled; SDPA with the mask written out on a CPU).

``--compile`` runs every variant through ``torch.compile``. Model FLOPs per token are nanoGPT's
(and PaLM's appendix B) estimate, the same for every variant so that MFU compares them:
``6·N + 12·L·H·Q·T``, with N the weights that multiply (every block's and the output head's; no
embedding table), L layers, H heads, Q head width and T the window length (causal attention counted
in full, as nanoGPT does). MFU is against ``gpu_throughput.py``'s peak table (or ``--peak-tflops``).
On a GPU the default model is GPT-2 125M's shape (``gpt125``) at 1,024 tokens in bf16.

    .venv/bin/python bench/gpt_step.py [--model gpt_tiny] [--device cpu] [--precision fp32] [--compile]
        [--batch 8] [--seq 256] [--steps 10] [--rounds 3] [--peak-tflops X]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch
from gpu_throughput import peak_tflops

from trainrun.config import compose
from trainrun.core.precision import resolve_precision
from trainrun.data.causal_text import stream_datasets
from trainrun.models.build import build_model
from trainrun.models.gpt import GPT
from trainrun.models.llama import Llama
from trainrun.optim.optimizers import build_optimizer
from trainrun.schema import GPTConfig, LlamaConfig, OptimizerConfig
from trainrun.tasks.causal_lm import next_token_cross_entropy
from trainrun.validation import validate

VARIANTS = {"adamw": ("adamw", False), "muon": ("muon", False), "adamw, document mask": ("adamw", True)}
RATES = {"adamw": 6e-4, "muon": 0.05}  # gpt125's and the speedrun's (Muon's Adam groups: optimizer.muon's)


def model_flops_per_token(config: GPTConfig | LlamaConfig, model: GPT | Llama, seq: int) -> float:
    """``6·N + 12·L·H·Q·T`` (nanoGPT's ``estimate_mfu``), N the blocks' and the head's weights (a
    tied head counted: its product runs whatever its weight is shared with): a GPT's or a Llama's."""
    weights = sum(p.numel() for p in model.blocks.parameters()) + model.head.weight.numel()
    return 6 * weights + 12 * config.layers * config.width * seq


def train_steps(model, optimizer, data: list[torch.Tensor], precision, steps: int) -> torch.Tensor:
    """``steps`` optimizer steps; the last loss, not read back."""
    for index in range(steps):
        window = data[index % len(data)]
        with precision.autocast():
            loss = next_token_cross_entropy(model(window[:, :-1]), window[:, 1:])
        (precision.scaler.scale(loss) if precision.scaler else loss).backward()
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    return loss


def token_rate(model, optimizer, data, precision, steps: int, device: torch.device) -> float:
    """Tokens per second over ``steps`` optimizer steps."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    train_steps(model, optimizer, data, precision, steps).item()
    batch, length = data[0].shape
    return steps * batch * (length - 1) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--model", default="gpt125" if on_gpu else "gpt_tiny", help="a conf/model/gpt_* option")
    parser.add_argument("--device", default="cuda" if on_gpu else "cpu")
    parser.add_argument("--precision", default="bf16" if on_gpu else "fp32", choices=["fp32", "amp", "bf16"])
    parser.add_argument("--batch", type=int, default=16 if on_gpu else 8)
    parser.add_argument("--seq", type=int, default=1024 if on_gpu else 256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="every variant through torch.compile")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak, if not in gpu_throughput.py's table")
    args = parser.parse_args()
    device = torch.device(args.device)
    overrides = ["task=causal_lm", "data=stdlib_stream", f"model={args.model}", f"data.text.max_seq_len={args.seq}"]
    config = validate(compose([*overrides, f"model.gpt.max_seq_len={args.seq}"]), files=False)
    sets = stream_datasets(config.data)
    windows = sets.train
    data = [torch.stack([windows[b * args.batch + i] for i in range(args.batch)]).to(device) for b in range(4)]
    models = {}
    for name, (optimizer_name, document_mask) in VARIANTS.items():
        torch.manual_seed(0)
        gpt_config = dataclasses.replace(config.model.gpt, document_mask=document_mask)
        gpt = build_model(dataclasses.replace(config.model, gpt=gpt_config), sets.text).to(device)
        settings = OptimizerConfig(name=optimizer_name, lr=RATES[optimizer_name], weight_decay=0.0)
        optimizer = build_optimizer(gpt, settings, args.batch)
        models[name] = (torch.compile(gpt) if args.compile else gpt, optimizer)
    precision, _ = resolve_precision(args.precision, device)
    for name, (model, optimizer) in models.items():  # warm-up: allocator, kernels, compilation
        started = time.perf_counter()
        token_rate(model, optimizer, data, precision, 2, device)
        print(f"warm-up {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (model, optimizer) in models.items():
            rates[name].append(token_rate(model, optimizer, data, precision, args.steps, device))
    flops = model_flops_per_token(config.model.gpt, models["adamw"][0], args.seq)
    peak = peak_tflops(device, args.precision, args.peak_tflops, torch.get_float32_matmul_precision() != "highest")
    print(
        f"{args.model} on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
        f"{args.precision}, torch {torch.__version__}, batch {args.batch} x {args.seq} tokens"
        + (", compiled" if args.compile else "")
        + f", {args.steps} steps x {args.rounds} rounds, {flops / 1e6:.1f} MFLOP per token"
        + (f", peak {peak:g} TFLOP/s" if peak else "")
    )
    print("| variant | tokens/s (best) | rounds | vs adamw | model TFLOP/s | MFU |")
    print("| --- | --- | --- | --- | --- | --- |")
    reference = max(rates["adamw"])
    for name, values in rates.items():
        best = max(values)
        achieved = best * flops / 1e12
        rounds = ", ".join(f"{value:,.0f}" for value in values)
        mfu = f"{achieved / peak:.1%}" if peak else "–"
        print(f"| {name} | {best:,.0f} | {rounds} | {best / reference:.2f}x | {achieved:.3g} | {mfu} |")


if __name__ == "__main__":
    main()
