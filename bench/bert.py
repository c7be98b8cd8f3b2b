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
tokens per second, the FLOP/s the variant executes (torch's FLOP counter over the same batches;
unpadding and the masked head do fewer) and, on a GPU of ``gpu_throughput.py``'s peak table (or
with ``--peak-tflops``), the model FLOPs utilisation. ``--compile`` adds the whole model
through ``torch.compile``.

    .venv/bin/python bench/bert.py [--model bert_base] [--device cuda] [--precision bf16] [--compile]
        [--batch 64] [--seq 128] [--fill 0.5 | --lengths corpus] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch
from gpu_throughput import peak_tflops

from trainrun.algorithms.fused_layers import fuse_layers
from trainrun.config import compose
from trainrun.core.precision import resolve_precision
from trainrun.data.masked_text import IGNORED, text_datasets
from trainrun.models.bert import build_bert
from trainrun.schema import DataConfig, validate
from trainrun.tasks.masked_lm import masked_cross_entropy

VARIANTS = {  # name: (unpadding, masked head, model: eager, fused layers or compiled)
    "padded": (False, False, "eager"),
    "padded + masked head": (False, True, "eager"),
    "unpadded": (True, False, "eager"),
    "unpadded + masked head": (True, True, "eager"),
    "padded + fused layers": (False, False, "fused"),
    "unpadded + masked head + fused layers": (True, True, "fused"),
}
COMPILED_VARIANTS = {  # with --compile: the whole model through torch.compile (dynamic shapes)
    "padded + compile": (False, False, "compiled"),
    "unpadded + masked head + compile": (True, True, "compiled"),
}
VOCAB = 8192


def corpus_lengths(seq: int) -> torch.Tensor:
    """The lengths of the built-in corpus's samples padded to ``seq`` (``data=stdlib_docs``,
    ``data.packing=pad``: each document cut into pieces, ``[CLS]`` and ``[SEP]`` added)."""
    samples, _ = text_datasets(DataConfig(name="text", corpus="stdlib_docs", max_seq_len=seq, packing="pad"))
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
        made.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return [{key: value.to(device) for key, value in item.items()} for item in made]


def forward_backward(model, batch: dict[str, torch.Tensor], masked_head: bool, precision) -> torch.Tensor:
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if masked_head:
        inputs["predict"] = batch["labels"] != IGNORED
    with precision.autocast():
        loss = masked_cross_entropy(model(inputs), batch["labels"])
    loss.backward()
    return loss


def step_rate(models, data, precision, variant: tuple[bool, bool, str], steps: int, device: torch.device) -> float:
    """Sequences per second over ``steps`` optimizer steps of ``variant``; ``models`` maps its
    model kind to (model, the module whose ``unpad`` switches, optimizer)."""
    unpad, masked_head, kind = variant
    model, bert, optimizer = models[kind]
    bert.unpad = unpad
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for index in range(steps):
        loss = forward_backward(model, data[index % len(data)], masked_head, precision)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    return steps * data[0]["input_ids"].shape[0] / (time.perf_counter() - started)


def flops_per_sequence(model, data, precision, unpad: bool, masked_head: bool) -> float:
    """FLOPs of one forward and backward pass per sequence, counted by torch over ``data``."""
    from torch.utils.flop_counter import FlopCounterMode

    model.unpad = unpad
    with FlopCounterMode(display=False) as counter:
        for batch in data:
            forward_backward(model, batch, masked_head, precision)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / sum(len(batch["input_ids"]) for batch in data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_tiny", help="a conf/model/bert_* option")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
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
    parser.add_argument("--peak-tflops", type=float, help="the device's peak, if not in gpu_throughput.py's table")
    args = parser.parse_args()
    device = torch.device(args.device)
    overrides = ["task=masked_lm", "data=stdlib_docs", f"model={args.model}", "model.hidden_dropout=0"]
    config = validate(compose([*overrides, "model.attention_dropout=0"]), files=False)
    variants = {**VARIANTS, **(COMPILED_VARIANTS if args.compile else {})}
    models = {}
    for kind in sorted({kind for _, _, kind in variants.values()}):
        torch.manual_seed(0)
        bert = build_bert(config.model, VOCAB).to(device)
        if kind == "fused":
            fuse_layers(bert)
        model = torch.compile(bert, dynamic=True) if kind == "compiled" else bert
        models[kind] = (model, bert, torch.optim.AdamW(bert.parameters(), lr=1e-4))
    precision, _ = resolve_precision(args.precision, device)
    corpus = corpus_lengths(args.seq) if args.lengths == "corpus" else None
    data = batches(4, args.batch, args.seq, args.fill, device, corpus)
    real_tokens = sum(int(b["attention_mask"].sum()) for b in data) / sum(len(b["input_ids"]) for b in data)
    flops = {  # the same arithmetic whichever way the model runs
        (unpad, head): flops_per_sequence(models["eager"][0], data, precision, unpad, head)
        for unpad, head, _ in variants.values()
    }
    for variant in variants.values():  # warm-up: allocator, kernels, autotuning, compilation
        step_rate(models, data, precision, variant, 2, device)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            rates[name].append(step_rate(models, data, precision, variant, args.steps, device))
    peak = peak_tflops(device, args.precision, args.peak_tflops)
    print(
        f"{args.model} on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
        f"{args.precision}, torch {torch.__version__}, batch {args.batch} x {args.seq} tokens, "
        f"{real_tokens / args.seq:.0%} real tokens ({args.lengths} lengths), {args.steps} steps x {args.rounds} rounds"
        + (f", peak {peak:g} TFLOP/s" if peak else "")
    )
    print("| variant | seq/s (best) | rounds | vs padded | real tokens/s | TFLOP/s | MFU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    reference = max(rates["padded"])
    for name, values in rates.items():
        best, (unpad, head, _) = max(values), variants[name]
        achieved = best * flops[unpad, head] / 1e12
        mfu = f"{achieved / peak:.1%}" if peak else "–"
        rounds = ", ".join(f"{value:.1f}" for value in values)
        print(
            f"| {name} | {best:.1f} | {rounds} | {best / reference:.2f}x | {best * real_tokens:,.0f} "
            f"| {achieved:.3g} | {mfu} |"
        )


if __name__ == "__main__":
    main()
