"""The recipes' fast paths on one GPU: each LLM recipe (and BERT-Base's) trained a few steps at its
own shape, eager against ``compile=true``, and fp8 compiled against bf16 compiled for the Llama:
tokens (or sequences) per second, MFU, peak memory, and what torch.compile did (``summary.json``'s
``compile``: graph breaks, recompiles after warm-up, seconds).

Each run is ``trainrun recipe=NAME`` in its own process on the built-in data (``--data``'s
overrides), one device, ``--steps`` steps with an evaluation halfway (which ends warm-up); the rate is
the second half's (``metrics.jsonl``'s last ``throughput``), so compilation is left out. MFU is
``trainrun estimate``'s FLOPs of a step (counted on fake tensors: the same model, batch and
checkpointing; none for BERT, which it does not size) over the step's time, against the bf16 peak
of ``gpu_throughput.py``'s table.

    python bench/fast_paths.py [--recipes gpt125 gpt_speedrun llama31_8b bert_base] [--steps 20]
    .venv/bin/python bench/fast_paths.py --cpu  # the same runs, tiny, on this CPU (a smoke check)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from gpu_throughput import peak_tflops

from trainrun.config import compose
from trainrun.errors import ConfigError
from trainrun.estimate import estimate
from trainrun.validation import validate

STREAM = ["data=stdlib_stream", "data.num_workers=8", "stop_at=null", "checkpoint.interval=null"]
DOCS = ["data=stdlib_docs", "data.num_workers=8", "stop_at=null", "checkpoint.interval=null"]
# each recipe at its own micro-batch (the Llama 8B recipe's on the 1B model, as bench/sharding.py runs it)
RECIPES = {
    "gpt125": [*STREAM, "train_batch_size=32", "device_train_microbatch_size=16"],
    "gpt_speedrun": [*STREAM, "train_batch_size=32", "device_train_microbatch_size=16"],
    "llama31_8b": [
        *STREAM,
        "model=llama3_1b",
        "data.text.max_seq_len=2048",
        "data.text.val_tokens=8192",  # the recipe's 1,024 x 8,192 are more than the docs hold
        "train_batch_size=4",
        "device_train_microbatch_size=1",
    ],
    "bert_base": [*DOCS, "train_batch_size=256", "device_train_microbatch_size=256"],
}
VARIANTS = {"eager": ["compile=false"], "compiled": ["compile=true"]}
FP8 = {"llama31_8b"}  # recipes also run in fp8, compiled
CPU = [
    "launcher.devices=1",
    "data.num_workers=0",
    "precision=fp32",
    "train_batch_size=4",
    "device_train_microbatch_size=2",
]
TINY_GPT = ["model=gpt_tiny", "model.gpt.heads=4"]
CPU_MODELS = {
    "gpt125": TINY_GPT,
    "gpt_speedrun": [*TINY_GPT, "model.gpt.value_embeddings=1"],
    "llama31_8b": ["model=llama_tiny"],
    "bert_base": ["model=bert_tiny"],
}


def trained(args: list[str], folder: Path, timeout: int = 600) -> tuple[list[dict], dict] | str:
    """``trainrun ARGS`` in its own process, its run folder ``folder``: its ``metrics.jsonl`` records
    and its ``summary.json``, or where it failed its last line (the lines before it printed, for the
    step's log)."""
    args = [*args, f"hydra.run.dir={folder}"]
    done = subprocess.run([sys.executable, "-m", "trainrun", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or ["no output"]
        print("\n".join(lines[-25:]), file=sys.stderr, flush=True)
        return lines[-1]
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((folder / "summary.json").read_text())


def run(recipe: str, overrides: list[str], steps: int, folder: Path) -> dict:
    """One recipe run's figures (rate, peak memory, compile record), or its error."""
    args = [f"recipe={recipe}", *overrides, f"max_duration={steps}ba", f"eval_interval={steps // 2}ba"]
    args += ["launcher.devices=1", "progress=false", "export=false"]
    result = trained(args, folder)
    if isinstance(result, str):
        return {"error": result}
    records, summary = result
    config = validate(compose(args), files=False)
    try:
        flops = estimate(config).step_flops
    except ConfigError:  # a task trainrun estimate does not size (masked LM): no MFU
        flops = None
    return {
        "rate": records[-1]["throughput"],
        "batch": config.train_batch_size,
        "tokens": config.data.text.max_seq_len if recipe != "bert_base" else None,
        "flops": flops,
        "peak_gb": summary["peak_memory_gb"],
        "compile": summary["compile"],
    }


def row(recipe: str, variant: str, figures: dict, peak: float | None) -> str:
    if "error" in figures:
        return f"| {recipe} | {variant} | failed: {figures['error']} | | | | |"
    rate, unit = figures["rate"], "seq/s"
    if figures["tokens"]:
        rate, unit = rate * figures["tokens"], "tokens/s"
    step_seconds = figures["batch"] / figures["rate"]
    mfu = f"{figures['flops'] / step_seconds / (peak * 1e12):.1%}" if peak and figures["flops"] else "-"
    memory = f"{figures['peak_gb']:.1f}" if figures["peak_gb"] is not None else "-"
    record = figures["compile"]
    compiled = (
        f"{record['graph_breaks']} breaks, {record['recompiles']} recompiles, {record['seconds']:.0f} s"
        if record
        else "-"
    )
    return f"| {recipe} | {variant} | {rate:,.0f} {unit} | {mfu} | {memory} | {compiled} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="tiny models on this CPU: a smoke check of the runs")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    peak = peak_tflops(device, "bf16", None, fp32_on_tensor_cores=False)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {args.steps} steps a run, the rate of the second half")
    print("| recipe | variant | rate | MFU | peak GB | torch.compile |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        for recipe in args.recipes:
            variants = dict(VARIANTS)
            if recipe in FP8:
                variants["fp8 compiled"] = ["compile=true", "precision=fp8"]
            for variant, extra in variants.items():
                overrides = [*RECIPES[recipe], *extra]
                if args.cpu:
                    overrides = [*overrides, *CPU, *CPU_MODELS[recipe], "data.text.max_seq_len=64"]
                    if variant == "fp8 compiled":
                        continue  # float8 matrix units: a GPU's
                figures = run(recipe, overrides, args.steps, Path(scratch) / f"{recipe}-{variant}")
                print(row(recipe, variant, figures, peak), flush=True)


if __name__ == "__main__":
    main()
