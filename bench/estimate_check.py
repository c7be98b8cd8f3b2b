"""``trainrun estimate`` against what a GPU measures: the same Llama runs built as a run builds them,
their peak of allocated memory read from torch after a few AdamW steps, beside the estimate computed
for the same config on the host (fake tensors, no device memory).

One process on one GPU, a process group of one (FSDP2 on a mesh of one where asked). Shapes: the
H200 table's 2 x 4,096 tokens without checkpointing (whole and FSDP2), and the 8B recipe's
micro-batch at 1B size (1 x 8,192 tokens, selective checkpointing, FSDP2), vocabulary 8,192 (the
built-in corpus's) unless ``--vocab``.

    python bench/estimate_check.py [--model llama3_1b] [--vocab 8192] [--steps 3]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from sharding import build_variant, free_port, llama_config, timed_steps

from trainrun.config import compose
from trainrun.core.precision import resolve_precision
from trainrun.validation import validate

SHAPES = (  # (parallel, batch, tokens, activation checkpointing)
    ("ddp", 2, 4096, "none"),
    ("fsdp", 2, 4096, "none"),
    ("fsdp", 1, 8192, "selective"),
)


def estimated(model: str, vocab: int, parallel: str, batch: int, seq: int, checkpointing: str) -> float:
    """The estimate's peak (GB) for the run that ``measured`` builds, computed without the device."""
    from trainrun.estimate import estimate

    overrides = ["task=causal_lm", "data=stdlib_stream", f"model={model}", "precision=bf16", "optimizer=adamw"]
    overrides += [f"data.text.max_seq_len={seq}", f"train_batch_size={batch}", f"eval_batch_size={batch}"]
    overrides += [f"parallel={parallel}", f"parallel.activation_checkpointing={checkpointing}", "launcher.devices=1"]
    return estimate(validate(compose(overrides), files=False), vocab=vocab).peak_gb


def measured(args, parallel: str, batch: int, seq: int, checkpointing: str, device: torch.device) -> float:
    """Peak GB allocated over ``args.steps`` AdamW steps of the model built as a run builds it."""
    precision, _ = resolve_precision("bf16", device)
    settings = argparse.Namespace(vocab=args.vocab, activation_checkpointing=checkpointing, compile=False)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, optimizer = build_variant(llama_config(args.model), parallel, precision, settings, device)
    tokens = torch.randint(0, args.vocab, (batch, seq + 1), device=device)
    timed_steps(model, optimizer, precision, tokens, args.steps, device)
    peak = torch.cuda.max_memory_allocated() / 1e9
    del model, optimizer
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3_1b")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/estimate_check.py measures a GPU; on this machine run trainrun estimate alone")
    device = torch.device("cuda")
    guesses = [estimated(args.model, args.vocab, *shape) for shape in SHAPES]  # before the real process group
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl")
    print(f"model={args.model} on {torch.cuda.get_device_name()}, vocabulary {args.vocab}, bf16, AdamW")
    print("| parallel | batch x tokens | checkpointing | measured GB | estimated GB | estimate / measured |")
    print("|---|---|---|---|---|---|")
    for (parallel, batch, seq, checkpointing), guess in zip(SHAPES, guesses, strict=True):
        got = measured(args, parallel, batch, seq, checkpointing, device)
        row = f"| {parallel} | {batch} x {seq:,} | {checkpointing} | {got:.1f} | {guess:.1f} | {guess / got:.2f}x |"
        print(row, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
