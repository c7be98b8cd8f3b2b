"""What the peers' CPU sections (``peers.py``) and GPU sections (``peers_gpu.py``) share: the step
timings and their ratios, nanoGPT's folder, command line, log and evaluation, trainrun's GPT loss on
the same windows, and the BERT samples and tokenizer both sides read. Each of the two imports this
file, and neither imports the other's sections back (``peers.py``'s ``main`` dispatches to
``peers_gpu.run_sections``).
"""

from __future__ import annotations

import json
import pickle
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gpt import PUBLISHED_STEPS

ROOT = Path(__file__).resolve().parents[1]
NANOGPT_ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")
BERT_COMPANION = [
    "task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "data.text.packing=pack", "optimizer=adamw",
    "optimizer.lr=2e-3", "train_batch_size=32", "progress=false",
]  # fmt: skip


def warm(values: list) -> list:
    """What follows the first tenth of a run's steps, and at least two (allocator, caches and
    threads warm)."""
    return values[max(2, len(values) // 10) :]


def step_ms(durations: list[float]) -> float:
    """The median warm step, in ms."""
    return 1000 * statistics.median(warm(durations))


def trainrun_steps(run_dir: Path) -> list[float]:
    """Each step's seconds from the run's steps.jsonl, evaluation and checkpointing left out."""
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return [sum(v for k, v in row.items() if k not in ("step", "eval", "checkpoint")) for row in rows]


def ratio_text(peer: list[float], ours: list[float]) -> str:
    """The median of the rounds' peer / trainrun ratios, each round's beside it."""
    ratios = [p / o for p, o in zip(peer, ours, strict=True)]
    return f"**{statistics.median(ratios):.2f}x** (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"


def nanogpt_workdir(nanogpt: Path, out: Path, train: torch.Tensor, val: torch.Tensor, vocab: int) -> Path:
    """A folder nanoGPT's train.py runs in: its configurator, and data/trainrun/ holding the same
    token streams as uint16 ``train.bin``/``val.bin`` and ``meta.pkl`` with the vocabulary size."""
    work = out / "nanogpt"
    data = work / "data" / "trainrun"
    data.mkdir(parents=True, exist_ok=True)
    for name, windows in (("train", train), ("val", val)):
        stream = torch.cat([windows[:, :-1].flatten(), windows[-1, -1:]]).numpy().astype(np.uint16)
        stream.tofile(data / f"{name}.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": vocab}))
    link = work / "configurator.py"
    link.unlink(missing_ok=True)  # a link left by an earlier run may point elsewhere
    link.symlink_to(nanogpt / "configurator.py")
    return work


def nanogpt_command(nanogpt_dir: Path, rate: float, steps: int, out_dir: Path, settings: dict) -> list[str]:
    """nanoGPT's train.py with gpt125's settings at ``settings``' shape (and device, dtype, compile)."""
    warmup = round(140 * steps / PUBLISHED_STEPS["gpt125"])
    options = {
        "out_dir": out_dir, "dataset": "trainrun", "gradient_accumulation_steps": 1,
        "dropout": 0.1, "bias": True, "learning_rate": rate,
        "max_iters": steps, "lr_decay_iters": steps, "warmup_iters": warmup, "min_lr": 0.0, "weight_decay": 0.0,
        "beta2": 0.999, "grad_clip": 1.0, "eval_interval": steps, "eval_iters": 1, "log_interval": 1,
        "always_save_checkpoint": True, "device": "cpu", "dtype": "float32", "compile": False, **settings,
    }  # fmt: skip
    return [sys.executable, str(nanogpt_dir / "train.py"), *(f"--{k}={v}" for k, v in options.items())]


def nanogpt_durations(stdout: str, steps: int) -> list[float]:
    """Each step's seconds as nanoGPT's log prints them (iteration ``steps`` runs one step past the
    saved model, and is left out)."""
    times = {int(m[1]): float(m[2]) / 1000 for m in map(NANOGPT_ITER.match, stdout.splitlines()) if m}
    return [times[i] for i in range(steps)]


@torch.no_grad()
def next_token_loss(logits_of, windows: torch.Tensor, device: str = "cpu") -> float:
    """The evaluator: mean next-token cross-entropy over every validation window."""
    total, count = 0.0, 0
    for batch in windows.to(device).split(32):
        logits = logits_of(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="sum"))
        count += batch[:, 1:].numel()
    return total / count


def nanogpt_loss(nanogpt_dir: Path, out_dir: Path, windows: torch.Tensor, device: str = "cpu") -> float:
    sys.path.insert(0, str(nanogpt_dir))
    from model import GPT, GPTConfig

    sys.path.remove(str(nanogpt_dir))
    saved = torch.load(out_dir / "ckpt.pt", map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**saved["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in saved["model"].items()})
    return next_token_loss(lambda x, y: model.to(device).eval()(x, y)[0], windows, device)


def trainrun_gpt_loss(run_dir: Path, windows: torch.Tensor, device: str = "cpu") -> float:
    from trainrun.commands.sample import load_run

    model = load_run(run_dir)[0].to(device)
    return next_token_loss(lambda x, y: model(x), windows, device)


def bert_sets(args: list[str] = BERT_COMPANION):
    """The run's training and held-out samples (the held-out ones with fixed masks)."""
    from trainrun.config import compose
    from trainrun.data.masked_text import text_datasets
    from trainrun.validation import validate

    return text_datasets(validate(compose(args), files=False).data)


def padded_samples(train) -> list[dict]:
    """trainrun's training documents as Hugging Face samples: [CLS] tokens [SEP], padded to the
    window, with their attention masks."""
    length, samples = train.max_seq_len, []
    for index in range(len(train)):
        ids = [train.cls, *train.tokens(index).tolist(), train.sep]
        padding = length - len(ids)
        samples.append({"input_ids": ids + [train.pad] * padding, "attention_mask": [1] * len(ids) + [0] * padding})
    return samples


def bert_tokenizer(train):
    """The store's tokenizer as ``transformers`` reads it, BERT's special tokens named."""
    from transformers import PreTrainedTokenizerFast

    specials = {f"{name}_token": f"[{name.upper()}]" for name in ("unk", "pad", "cls", "sep", "mask")}
    return PreTrainedTokenizerFast(tokenizer_file=str(train.tokenizer_file), **specials)
