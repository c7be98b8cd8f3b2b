"""BERT training step: padded, unpadded, with the MLM head on masked positions only, and fused layers.

One optimizer step (forward, masked-LM loss, backward, AdamW) of trainrun's BERT on batches of
sequences padded to ``--seq`` tokens, whose lengths are drawn uniformly so that real tokens fill
about ``--fill`` of the batch (documents padded to a fixed length, as Mosaic BERT and MLPerf feed
them), with 15 % of the real tokens masked. "fused layers" is the algorithm ``fused_layers`` (each
layer's dropout-add-LayerNorm and dense-GeLU blocks compiled) on a copy of the same model; its
compilation happens in the warm-up. The variants run in alternating rounds on the same batches,
so drift in machine speed hits all of them; the best round of each is compared. The ratios
printed are against the padded model with the full head.

    .venv/bin/python bench/bert.py [--model bert_base] [--device cuda] [--precision bf16]
        [--batch 64] [--seq 128] [--fill 0.5] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from trainrun.algorithms.fused_layers import fuse_layers
from trainrun.config import compose
from trainrun.core.precision import resolve_precision
from trainrun.data.masked_text import IGNORED
from trainrun.models.bert import build_bert
from trainrun.schema import validate
from trainrun.tasks.masked_lm import masked_cross_entropy

VARIANTS = {  # name: (unpadding, masked head, fused layers)
    "padded": (False, False, False),
    "padded + masked head": (False, True, False),
    "unpadded": (True, False, False),
    "unpadded + masked head": (True, True, False),
    "padded + fused layers": (False, False, True),
    "unpadded + masked head + fused layers": (True, True, True),
}
VOCAB = 8192


def batches(count: int, batch: int, seq: int, fill: float, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Padded batches whose lengths are uniform on [1, 2·fill·seq - 1] (mean fill·seq), 15 % masked."""
    generator = torch.Generator().manual_seed(0)
    longest = max(1, min(seq, round(2 * fill * seq) - 1))
    made = []
    for _ in range(count):
        lengths = torch.randint(1, longest + 1, (batch,), generator=generator)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = torch.randint(5, VOCAB, (batch, seq), generator=generator) * mask
        chosen = (torch.rand(batch, seq, generator=generator) < 0.15) & mask.bool()
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORED))
        made.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return [{key: value.to(device) for key, value in item.items()} for item in made]


def step_rate(models, data, precision, variant: str, steps: int, device: torch.device) -> float:
    """Sequences per second over ``steps`` optimizer steps of ``variant``; ``models`` maps
    fused or not to (model, optimizer)."""
    unpad, masked_head, fused = VARIANTS[variant]
    model, optimizer = models[fused]
    model.unpad = unpad
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for index in range(steps):
        batch = data[index % len(data)]
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if masked_head:
            inputs["predict"] = batch["labels"] != IGNORED
        with precision.autocast():
            loss = masked_cross_entropy(model(inputs), batch["labels"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    return steps * data[0]["input_ids"].shape[0] / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_tiny", help="a conf/model/bert_* option")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp", "bf16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--fill", type=float, default=0.5, help="mean share of real tokens in a batch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    overrides = ["task=masked_lm", "data=stdlib_docs", f"model={args.model}", "model.hidden_dropout=0"]
    config = validate(compose([*overrides, "model.attention_dropout=0"]), files=False)
    models = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = build_bert(config.model, VOCAB).to(device)
        if fused:
            fuse_layers(model)
        models[fused] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    precision, _ = resolve_precision(args.precision, device)
    data = batches(4, args.batch, args.seq, args.fill, device)
    real = sum(int(b["attention_mask"].sum()) for b in data) / sum(b["attention_mask"].numel() for b in data)
    for variant in VARIANTS:  # warm-up: allocator, kernels, autotuning
        step_rate(models, data, precision, variant, 2, device)
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            rates[variant].append(step_rate(models, data, precision, variant, args.steps, device))
    print(
        f"{args.model} on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
        f"{args.precision}, torch {torch.__version__}, batch {args.batch} x {args.seq} tokens, "
        f"{real:.0%} real tokens, {args.steps} steps x {args.rounds} rounds"
    )
    print("| variant | seq/s (best) | rounds | vs padded |")
    print("| --- | --- | --- | --- |")
    reference = max(rates["padded"])
    for variant, values in rates.items():
        rounds = ", ".join(f"{value:.1f}" for value in values)
        print(f"| {variant} | {max(values):.1f} | {rounds} | {max(values) / reference:.2f}x |")


if __name__ == "__main__":
    main()
