"""BERT training step: padded, unpadded, with the MLM head on masked positions only, and fused layers.

One optimizer step (forward, masked-LM loss, backward, AdamW) of trainrun's BERT on batches of
sequences padded to ``--seq`` tokens, whose lengths are drawn uniformly so that real tokens fill
about ``--fill`` of the batch, or (``--lengths corpus``) are those of the built-in docstrings
cut at ``--seq`` (documents padded to a fixed length, as Mosaic BERT and MLPerf feed them), with
15 % of the real tokens masked. "fused layers" is the algorithm ``fused_layers`` (each
layer's dropout-add-LayerNorm and dense-GeLU blocks compiled) on a copy of the same model; its
compilation happens in the warm-up. The variants run in alternating rounds on the same batches,
so drift in machine speed hits all of them; the best round of each is compared. The ratios
printed are against the padded model with the full head. Each row also gives real (non-pad)
tokens per second, the model FLOP/s and, on a GPU of ``gpu_throughput.py``'s peak table (or with
``--peak-tflops``), the model FLOPs utilisation. Model FLOPs are those the real tokens need, the
same for every variant (so MFU compares them): per sequence of n real tokens with m masked,
forward 2·n·(4·h² + 2·h·i) + 4·n²·h per layer plus 2·m·(h² + h·v) for the head, times 3 with the
backward pass (h hidden, i intermediate, v vocabulary). ``--compile`` adds the whole model
through ``torch.compile``; ``--attention sdpa varlen flex`` adds the unpadded + masked-head step
with each attention path (``model.bert.attention``; varlen and flex need a GPU), ``--alibi`` runs every
model with ALiBi's biases. The step is a run's: trainrun's fused AdamW, and under ``amp`` the
gradient scaler; fp32 matrix products run in fp32 (torch's default, as in a run), so fp32 MFU is
against the device's fp32 peak, not TF32's. On a GPU the default model is BERT-Base (BERT-Tiny
measures kernel launches there).

    .venv/bin/python bench/bert.py [--model bert_base] [--device cuda] [--precision bf16] [--compile]
        [--batch 64] [--seq 128] [--fill 0.5 | --lengths corpus] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from gpu_throughput import peak_tflops

from trainrun.algorithms.fused_layers import fuse_layers
from trainrun.config import compose
from trainrun.core.precision import resolve_precision
from trainrun.data.masked_text import IGNORED, collate_masked, text_datasets
from trainrun.models.bert import build_bert
from trainrun.optim.optimizers import build_optimizer
from trainrun.schema import BertConfig, DataConfig, OptimizerConfig, TextConfig
from trainrun.tasks.masked_lm import masked_cross_entropy
from trainrun.validation import validate

VARIANTS = {  # name: (unpadding, masked head, model: eager, fused layers or compiled, model.bert.attention)
    "padded": (False, False, "eager", "auto"),
    "padded + masked head": (False, True, "eager", "auto"),
    "unpadded": (True, False, "eager", "auto"),
    "unpadded + masked head": (True, True, "eager", "auto"),
    "padded + fused layers": (False, False, "fused", "auto"),
    "unpadded + masked head + fused layers": (True, True, "fused", "auto"),
}
COMPILED_VARIANTS = {  # with --compile: the whole model through torch.compile (dynamic shapes)
    "padded + compile": (False, False, "compiled", "auto"),
    "unpadded + masked head + compile": (True, True, "compiled", "auto"),
}
VOCAB = 8192


def corpus_lengths(seq: int) -> torch.Tensor:
    """The lengths of the built-in corpus's samples padded to ``seq`` (``data=stdlib_docs``,
    ``data.text.packing=pad``: each document cut into pieces, ``[CLS]`` and ``[SEP]`` added)."""
    samples, _ = text_datasets(
        DataConfig(name="text", text=TextConfig(corpus="stdlib_docs", max_seq_len=seq, packing="pad"))
    )
    return torch.from_numpy(samples.ends - samples.starts + 2)


def batches(
    count: int, batch: int, seq: int, fill: float, device: torch.device, corpus: torch.Tensor | None = None
) -> list[dict[str, torch.Tensor]]:
    """Padded batches, 15 % of their real tokens masked, whose lengths are drawn from ``corpus``'s
    or else uniform with mean fill·seq: on [1, 2·fill·seq - 1] up to half full, above it on
    [(2·fill - 1)·seq, seq]."""
    generator = torch.Generator().manual_seed(0)
    shortest = max(1, round((2 * fill - 1) * seq))
    longest = max(1, min(seq, round(2 * fill * seq) - 1))
    made = []
    for _ in range(count):
        if corpus is None:
            lengths = torch.randint(shortest, longest + 1, (batch,), generator=generator)
        else:
            lengths = corpus[torch.randint(0, len(corpus), (batch,), generator=generator)]
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = torch.randint(5, VOCAB, (batch, seq), generator=generator) * mask
        chosen = (torch.rand(batch, seq, generator=generator) < 0.15) & mask.bool()
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORED))
        samples = [
            {"input_ids": i, "attention_mask": m, "labels": y, "predict_positions": c.nonzero().squeeze(1)}
            for i, m, y, c in zip(ids, mask, labels, chosen, strict=True)
        ]
        made.append(collate_masked(samples))  # as the loader's workers send a batch
    on_host = ("lengths", "predict_counts")  # as the task keeps them
    return [{key: value if key in on_host else value.to(device) for key, value in item.items()} for item in made]


def forward_backward(model, batch: dict[str, torch.Tensor], precision) -> torch.Tensor:
    inputs = {
        key: batch[key] for key in ("input_ids", "attention_mask", "lengths", "predict_positions", "predict_counts")
    }
    with precision.autocast():
        loss = masked_cross_entropy(
            model(inputs),
            {"labels": batch["labels"], "predicted": batch["predicted_labels"], "counts": batch["predict_counts"]},
        )
    (precision.scaler.scale(loss) if precision.scaler else loss).backward()
    return loss


def train_steps(models, data, precision, variant: tuple[bool, bool, str, str], steps: int) -> torch.Tensor:
    """``steps`` optimizer steps of ``variant``; ``models`` maps its model kind to (model, the
    module whose switches are set, optimizer). Returns the last loss, not read back."""
    unpad, masked_head, kind, attention = variant
    model, bert, optimizer = models[kind]
    bert.unpad, bert.masked_head, bert.attention = unpad, masked_head, attention
    for index in range(steps):
        loss = forward_backward(model, data[index % len(data)], precision)
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    return loss


def step_rate(models, data, precision, variant: tuple[bool, bool, str, str], steps: int, device: torch.device) -> float:
    """Sequences per second over ``steps`` optimizer steps of ``variant``."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    train_steps(models, data, precision, variant, steps).item()
    return steps * data[0]["input_ids"].shape[0] / (time.perf_counter() - started)


def host_syncs(models, data, precision, variant: tuple[bool, bool, str, str]) -> str:
    """``none``, or the first operation of a step of ``variant`` that waits for the GPU (torch's
    sync debug mode raising on it); ``–`` off CUDA."""
    if not torch.cuda.is_available():
        return "–"
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_steps(models, data, precision, variant, 1)
    except RuntimeError as error:
        return str(error).splitlines()[0][:80]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "none"


def model_flops_per_sequence(config: BertConfig, data: list[dict[str, torch.Tensor]]) -> float:
    """Forward and backward FLOPs the real tokens need, per sequence (the formula in the docstring)."""
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.layers
    total = 0.0
    for batch in data:
        lengths = batch["attention_mask"].sum(1).double()
        masked = float((batch["labels"] != IGNORED).sum())
        per_layer = 2 * lengths * (4 * hidden**2 + 2 * hidden * inner) + 4 * lengths**2 * hidden
        total += 3 * (layers * float(per_layer.sum()) + 2 * masked * (hidden**2 + hidden * VOCAB))
    return total / sum(len(batch["input_ids"]) for batch in data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--model", default="bert_base" if on_gpu else "bert_tiny", help="a conf/model/bert_* option")
    parser.add_argument("--device", default="cuda" if on_gpu else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp", "bf16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--fill", type=float, default=0.5, help="mean share of real tokens (uniform lengths)")
    parser.add_argument(
        "--lengths", choices=["uniform", "corpus"], default="uniform", help="corpus: the docstrings' own (not --fill)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also the whole model through torch.compile")
    parser.add_argument(
        "--attention",
        nargs="+",
        default=[],
        choices=["sdpa", "varlen", "flex"],
        help="also the unpadded + masked head step with each of these model.bert.attention paths",
    )
    parser.add_argument("--alibi", action="store_true", help="every model with ALiBi (the alibi algorithm)")
    parser.add_argument(
        "--variants", nargs="+", metavar="NAME", help="time only these rows (and padded, the reference)"
    )
    parser.add_argument("--check-syncs", action="store_true", help="on a GPU, a column naming any wait for the device")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak, if not in gpu_throughput.py's table")
    args = parser.parse_args()
    device = torch.device(args.device)
    overrides = ["task=masked_lm", "data=stdlib_docs", f"model={args.model}", "model.bert.hidden_dropout=0"]
    config = validate(compose([*overrides, "model.bert.attention_dropout=0"]), files=False)
    variants = {**VARIANTS, **(COMPILED_VARIANTS if args.compile else {})}
    for path in args.attention:
        variants[f"unpadded + masked head, attention={path}"] = (True, True, "eager", path)
    if args.variants:
        if unknown := [name for name in args.variants if name not in variants]:
            parser.error(f"unknown variant '{unknown[0]}' (choose from: {', '.join(variants)})")
        variants = {name: variant for name, variant in variants.items() if name in {"padded", *args.variants}}
    models = {}
    for kind in sorted({kind for _, _, kind, _ in variants.values()}):
        torch.manual_seed(0)
        bert = build_bert(config.model.bert, VOCAB).to(device)
        if args.alibi:
            bert.use_alibi(args.seq)
        if kind == "fused":
            fuse_layers(bert)
        model = torch.compile(bert, dynamic=True) if kind == "compiled" else bert
        optimizer = build_optimizer(bert, OptimizerConfig(name="adamw", lr=1e-4, weight_decay=0.01), args.batch)
        models[kind] = (model, bert, optimizer)
    precision, _ = resolve_precision(args.precision, device)
    corpus = corpus_lengths(args.seq) if args.lengths == "corpus" else None
    data = batches(4, args.batch, args.seq, args.fill, device, corpus)
    real_tokens = sum(int(b["attention_mask"].sum()) for b in data) / sum(len(b["input_ids"]) for b in data)
    flops = model_flops_per_sequence(config.model.bert, data)
    for name, variant in variants.items():  # warm-up: allocator, kernels, autotuning, compilation
        started = time.perf_counter()
        step_rate(models, data, precision, variant, 2, device)
        print(f"warm-up {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    syncs = {name: host_syncs(models, data, precision, v) for name, v in variants.items()} if args.check_syncs else {}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            rates[name].append(step_rate(models, data, precision, variant, args.steps, device))
    peak = peak_tflops(device, args.precision, args.peak_tflops, torch.get_float32_matmul_precision() != "highest")
    print(
        f"{args.model} on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
        f"{args.precision}, torch {torch.__version__}, batch {args.batch} x {args.seq} tokens, "
        f"{real_tokens / args.seq:.0%} real tokens ({args.lengths} lengths), {args.steps} steps x {args.rounds} rounds"
        + (", ALiBi" if args.alibi else "")
        + (f", peak {peak:g} TFLOP/s" if peak else "")
    )
    print(
        "| variant | seq/s (best) | rounds | vs padded | real tokens/s | model TFLOP/s | MFU |"
        + (" syncs |" if syncs else "")
    )
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if syncs else ""))
    reference = max(rates["padded"])
    for name, values in rates.items():
        best = max(values)
        achieved = best * flops / 1e12
        mfu = f"{achieved / peak:.1%}" if peak else "–"
        rounds = ", ".join(f"{value:.1f}" for value in values)
        print(
            f"| {name} | {best:.1f} | {rounds} | {best / reference:.2f}x | {best * real_tokens:,.0f} "
            f"| {achieved:.3g} | {mfu} |" + (f" {syncs[name]} |" if syncs else "")
        )


if __name__ == "__main__":
    main()
