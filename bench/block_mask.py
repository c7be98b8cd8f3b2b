"""The document-causal block mask a GPT builds every forward on a GPU: time and host memory of
FlexAttention's ``create_block_mask`` (the rule evaluated at every query and key: a batch x length x
length pass) against trainrun's, built from each 128-token block's first and last document
(:func:`trainrun.models.gpt.flex_attend`).

Each (builder, length) runs in a process of its own (a fresh peak), ``--batch`` windows of random
documents (a separator about every ``--document`` tokens), a sliding window of ``--window`` tokens;
the memory is the build's peak resident memory less the resident memory before it (Linux's
``VmHWM`` - ``VmRSS``). Both masks are checked equal block by block first.

    .venv/bin/python bench/block_mask.py [--lengths 1024 8192] [--batch 8] [--window 1792] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import torch
from logits import resident_mb
from torch.nn.attention.flex_attention import create_block_mask

from trainrun.models.gpt import document_ids, flex_attend

SEPARATOR = 0


def windows(batch: int, length: int, document: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 50_000, (batch, length), generator=generator)
    tokens[torch.rand(batch, length, generator=generator) < 1 / document] = SEPARATOR
    return tokens


def build(name: str, documents: torch.Tensor, window: torch.Tensor):
    length = documents.shape[1]
    ours = flex_attend(length, window, documents, None, documents.device).block_mask
    if name == "trainrun":
        return ours
    return create_block_mask(ours.mask_mod, len(documents), None, length, length, device=documents.device)


def run(name: str, length: int, args: argparse.Namespace, results) -> None:
    documents = document_ids(windows(args.batch, length, args.document), SEPARATOR)
    window = torch.tensor(float(args.window))
    before, _ = resident_mb()
    seconds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        mask = build(name, documents, window)
        seconds.append(time.perf_counter() - start)
    _, peak = resident_mb()
    results[(name, length)] = (min(seconds), peak - before, mask.to_dense())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--document", type=int, default=600, help="mean tokens a document")
    parser.add_argument("--window", type=int, default=1792)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    results = context.Manager().dict()
    for length in args.lengths:
        for name in ("create_block_mask", "trainrun"):
            process = context.Process(target=run, args=(name, length, args, results))
            process.start()
            process.join()
            if process.exitcode:
                raise SystemExit(f"{name} at {length}: its process ended with exit code {process.exitcode}")
    print(f"{args.batch} windows, a document every ~{args.document} tokens, window {args.window}")
    print(f"torch {torch.__version__}")
    print("| tokens | builder | ms / build (best) | added memory (MB) | vs create_block_mask |")
    print("| --- | --- | --- | --- | --- |")
    for length in args.lengths:
        reference = results[("create_block_mask", length)]
        ours = results[("trainrun", length)]
        if not torch.equal(reference[2], ours[2]):
            raise SystemExit(f"the two block masks differ at {length} tokens")
        for name, (seconds, added, _) in (("create_block_mask", reference), ("trainrun", ours)):
            ratio = f"{reference[0] / seconds:.1f}x faster" if name == "trainrun" else ""
            print(f"| {length} | {name} | {seconds * 1e3:.2f} | {added:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
