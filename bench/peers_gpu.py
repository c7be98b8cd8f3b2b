"""trainrun beside its peers on a GPU: ``bench/peers.py --device cuda`` runs these sections.

- ``gpt``: ``recipe=gpt125`` (bf16, compiled) against nanoGPT's own ``train.py`` (its compile, fused
  AdamW, bf16) at GPT-2 124M's shape, 16 x 1,024 tokens a step, on the same token stream (the
  built-in stream, written as nanoGPT's ``train.bin``), gpt125's settings on both sides: tokens/s,
  MFU, validation loss at equal steps; then ``recipe=gpt_speedrun``'s time to nanoGPT's final loss.
- ``bert``: ``recipe=bert_base`` (its methods: unpadding, ALiBi, GLU, ...) against Hugging Face
  ``Trainer`` with ``BertForMaskedLM`` at BERT-Base's shape (bf16, fused AdamW, ``torch_compile`` off
  and on), 128-token samples of the built-in documents, the recipe's rates, masking and schedule on
  both: sequences/s and the training time to ``--bert-target`` masked accuracy (past the unigram
  plateau), evaluated every epoch on the same held-out samples and masks.
- ``llama``: ``recipe=llama31_8b`` on ``model=llama3_1b`` (its FSDP2, selective checkpointing and
  compile, micro-batches of one 2,048-token window, four a step) against ``Trainer`` with
  ``LlamaForCausalLM`` at the same shape and micro-batches (bf16, fused AdamW, gradient
  checkpointing, plain data parallel on one GPU): tokens/s, MFU, peak memory. (torchtitan: no
  wheel for torch 2.11 travels here; not run.)
- ``resnet``: ResNet-50 at 176 px on the same synthetic images (the same loader settings: batch
  256, 12 workers, pinned): trainrun with channels-last and fp16 AMP (bare), ``recipe=mild``, and
  PyTorch Lightning's ``Trainer`` with torchvision's ResNet-50 (``16-mixed``, channels-last); and
  the bare model step on tensors already on the GPU (the limit for the same kernels): images/s.

Every side runs in its own process; sides alternate order between rounds; a step's time is the
median after the first tenth of the steps (warm-up, compilation); ratios are a peer's time over
trainrun's (above 1: trainrun is faster). One evaluator a task scores every side's final model
(next-token loss on the held-out windows; masked accuracy on the held-out samples' fixed masks,
trainrun's BERT scored by its own evaluation there, since ``BertForMaskedLM`` cannot load ALiBi and
GLU). Each section stops at ``--section-limit`` seconds and prints what it measured by then.

``--scale tiny`` runs the same sections at tiny size on a CPU (``tests/test_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from gpt import COMPANION, schedule_ratio
from gpt_step import model_flops_per_token
from peers_shared import (
    ROOT,
    nanogpt_command,
    nanogpt_durations,
    nanogpt_loss,
    nanogpt_workdir,
    ratio_text,
    step_ms,
    trainrun_gpt_loss,
    trainrun_steps,
)

# each section's sizes: trainrun's arguments and the peers' matching settings
SCALES = {
    "gpu": {
        "gpt": {
            "trainrun": ["data=stdlib_stream", "data.text.max_seq_len=1024", "train_batch_size=16",
                         "device_train_microbatch_size=16", "eval_batch_size=16", "precision=bf16", "compile=true",
                         "data.num_workers=4", "progress=false", "export=false"],
            "nanogpt": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "batch_size": 16,
                        "dtype": "bfloat16", "compile": True, "device": "cuda"},
            "steps": 100, "speedrun": [],
        },
        "bert": {"trainrun": ["data=stdlib_docs", "data.num_workers=8", "train_batch_size=256",
                              "device_train_microbatch_size=256", "eval_batch_size=256"],
                 "batch": 256, "steps": 300, "eval_every": 20, "workers": 8, "bf16": True},
        "llama": {"trainrun": ["model=llama3_1b", "data=stdlib_stream", "data.text.max_seq_len=2048",
                               "data.text.val_tokens=8192",  # the recipe's 1,024 x 8,192 are more than the docs hold
                               "train_batch_size=4", "device_train_microbatch_size=1", "data.num_workers=4"],
                  "steps": 30, "bf16": True},
        "resnet": {"data": ["data=synthetic", "data.num_samples=12800", "data.num_classes=1000",
                            "data.resolution=176", "data.eval_resolution=176", "data.num_workers=12"],
                   "batch": 256, "steps": 50, "precision": "amp"},
    },
    "tiny": {
        "gpt": {
            "trainrun": [*COMPANION, "compile=false"],
            "nanogpt": {"n_layer": 2, "n_head": 2, "n_embd": 128, "block_size": 64, "batch_size": 16,
                        "dtype": "float32", "compile": False, "device": "cpu"},
            "steps": 4, "speedrun": ["model.gpt.value_embeddings=1"],
        },
        "bert": {"trainrun": ["data=stdlib_docs", "data.num_workers=0", "model=bert_tiny", "train_batch_size=32",
                              "device_train_microbatch_size=32", "eval_batch_size=64", "precision=fp32",
                              "data.text.max_seq_len=64"],
                 "batch": 32, "steps": 4, "eval_every": 2, "workers": 0, "bf16": False},
        "llama": {"trainrun": ["model=llama_tiny", "data=stdlib_stream", "data.text.max_seq_len=64",
                               "data.text.val_tokens=512",
                               "train_batch_size=4", "device_train_microbatch_size=1", "data.num_workers=0",
                               "precision=fp32", "compile=false"],
                  "steps": 3, "bf16": False},
        "resnet": {"data": ["data=synthetic", "data.num_samples=64", "data.num_classes=10", "data.resolution=32",
                            "data.eval_resolution=32", "data.num_workers=0"],
                   "batch": 4, "steps": 3, "precision": "fp32"},
    },
}  # fmt: skip
BERT_TARGET = 0.10  # masked accuracy past the built-in documents' unigram plateau (~5.5 %)


class SectionCut(Exception):
    """A section's time ran out: the section prints what it has."""


class SideFailed(Exception):
    """A side's process failed: the section goes on without it and prints why."""


@dataclass
class Section:
    """A section's output folder, device, scale and deadline."""

    name: str
    out: Path
    device: str
    scale: str
    deadline: float

    @property
    def sizes(self) -> dict:
        return SCALES[self.scale][self.name]

    def run(self, command: list[str], cwd: Path | None = None) -> str:
        """``command`` in its own process, stopped at the section's deadline; its standard output."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SectionCut("no time left")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")])}
        try:
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired as expired:
            raise SectionCut(f"{' '.join(command[1:4])} ... stopped at the section's limit") from expired
        if done.returncode:
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise SideFailed(f"{' '.join(command[1:4])} ... failed (exit {done.returncode}):\n{tail}")
        return done.stdout

    def trainrun(self, args: list[str], run_dir: Path) -> tuple[list[dict], list[float], dict]:
        """A trainrun run as a user runs it: its evaluations, each step's seconds (evaluation and
        checkpoints left out) and its summary."""
        shutil.rmtree(run_dir, ignore_errors=True)
        device = [] if self.device == "cuda" else ["device=cpu"]
        self.run([sys.executable, "-m", "trainrun", *args, *device, "launcher.devices=1", f"hydra.run.dir={run_dir}"])
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return rows, trainrun_steps(run_dir), json.loads((run_dir / "summary.json").read_text())

    def alternate(self, sides: dict, rounds: int, measure) -> dict[str, list]:  # noqa: ANN001
        """Each round measures every side (``measure(side, how, folder, round_index)``), the order
        reversed every other round, until the deadline; each side's measurements (a failed side's
        error printed, the others go on)."""
        results: dict[str, list] = {}
        try:
            for index in range(rounds):
                for side, how in list(sides.items())[:: 1 if index % 2 == 0 else -1]:
                    folder = self.out / f"{re.sub(r'[^A-Za-z0-9]+', '-', side)}-round{index + 1}"
                    try:
                        measured = measure(side, how, folder, index)
                    except SideFailed as failed:
                        print(f"{self.name}: {side}: {failed}")
                        continue
                    results.setdefault(side, []).append(measured)
        except SectionCut as cut:
            print(f"{self.name}: cut: {cut}")
        return results

    def side(self, name: str, out: Path, *extra: str) -> dict:
        """A peer's side (``--side NAME`` of this file) in its own process: its result.json."""
        shutil.rmtree(out, ignore_errors=True)
        command = [sys.executable, __file__, "--side", name, "--out", str(out), "--device", self.device]
        self.run([*command, "--scale", self.scale, *extra])
        return json.loads((out / "result.json").read_text())


def median_step(seconds: list[float]) -> float:
    """The median warm step, in seconds."""
    return step_ms(seconds) / 1000


def stream_model(args: list[str]):
    """(the run's language model built on the meta device, its config, its token stream's sets)."""
    from trainrun.config import compose
    from trainrun.data.causal_text import stream_datasets
    from trainrun.models.build import build_model
    from trainrun.validation import validate

    config = validate(compose(args), files=False)
    sets = stream_datasets(config.data)
    with torch.device("meta"):
        return build_model(config.model, sets.text), config, sets


def mfu(tokens_per_second: float, flops: float, device: str) -> str:
    from gpu_throughput import peak_tflops

    peak = peak_tflops(torch.device(device), "bf16", None, fp32_on_tensor_cores=False)
    return f"{tokens_per_second * flops / (peak * 1e12):.1%}" if peak else "-"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(title)
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


# ---------------------------------------------------------------- GPT-2 124M against nanoGPT


def compare_gpt(section: Section, args: argparse.Namespace) -> None:
    sizes, steps = section.sizes, section.sizes["steps"]
    recipe_args = ["recipe=gpt125", *sizes["trainrun"], schedule_ratio("gpt125", steps), f"eval_interval={steps}ba"]
    model, config, sets = stream_model(recipe_args)
    train, val = (data.__getitems__(list(range(len(data)))) for data in (sets.train, sets.val))
    work = nanogpt_workdir(args.nanogpt, section.out, train, val, sets.text.vocab_size)
    seq = config.data.text.max_seq_len
    flops = model_flops_per_token(config.model.gpt, model, seq)
    tokens = config.train_batch_size * seq
    results: dict[str, list[tuple[float, float, float]]] = {"trainrun": [], "nanoGPT": []}  # (s a step, loss, s)
    try:
        for index in range(args.rounds):
            for side in ("nanoGPT", "trainrun") if index % 2 == 0 else ("trainrun", "nanoGPT"):
                out = section.out / f"{side}-round{index + 1}"
                if side == "nanoGPT":
                    shutil.rmtree(out, ignore_errors=True)
                    command = nanogpt_command(args.nanogpt, config.optimizer.lr, steps, out, sizes["nanogpt"])
                    seconds = nanogpt_durations(section.run(command, cwd=work), steps)
                    loss = nanogpt_loss(args.nanogpt, out, val, section.device)
                else:
                    _, seconds, _ = section.trainrun(recipe_args, out)
                    loss = trainrun_gpt_loss(out, val, section.device)
                results[side].append((median_step(seconds), loss, sum(seconds)))
        target = statistics.median(v[1] for v in results["nanoGPT"])
        speedrun_args = ["recipe=gpt_speedrun", *sizes["trainrun"], *sizes["speedrun"]]
        speedrun_args += [schedule_ratio("gpt_speedrun", steps), f"eval_interval={max(1, steps // 10)}ba"]
        speedrun, _, _ = section.trainrun(speedrun_args, section.out / "trainrun-speedrun")
    except (SectionCut, SideFailed) as stopped:  # two sides: either missing ends the comparison
        print(f"gpt: stopped: {stopped}")
        speedrun, target = None, None
    rows = [
        [side, f"{tokens / statistics.median(v[0] for v in values):,.0f}",
         mfu(tokens / statistics.median(v[0] for v in values), flops, section.device),
         f"{statistics.median(v[1] for v in values):.4f}"]
        for side, values in results.items() if values
    ]  # fmt: skip
    print_table(
        f"gpt: recipe=gpt125 against nanoGPT train.py, {config.model.gpt.layers} layers x {config.model.gpt.width}, "
        f"{config.train_batch_size} x {seq} tokens, {steps} steps, {args.rounds} round(s), on {device_name(section)}",
        ["side", "tokens/s", "MFU", f"validation loss at step {steps}"],
        rows,
    )
    if all(results.values()):
        peer, ours = ([v[0] for v in results[side]] for side in ("nanoGPT", "trainrun"))
        print(f"gpt: nanoGPT's step time / trainrun's: {ratio_text(peer, ours)}")
    if speedrun and target is not None:
        reached = next((row["train_seconds"] for row in speedrun if row["eval_loss"] <= target), None)
        peer_seconds = statistics.median(v[2] for v in results["nanoGPT"])  # compilation in both
        print(
            f"gpt: recipe=gpt_speedrun to nanoGPT's final loss {target:.4f}: "
            + (f"{reached:.1f} s, **{peer_seconds / reached:.2f}x** nanoGPT's training time"
               if reached else f"not reached in {steps} steps (ends at {speedrun[-1]['eval_loss']:.4f})")
        )  # fmt: skip


def device_name(section: Section) -> str:
    return torch.cuda.get_device_name() if section.device == "cuda" else "CPU"


# ---------------------------------------------------------------- Llama 3.2 1B's shape against Trainer


def compare_llama(section: Section, args: argparse.Namespace) -> None:
    sizes, steps = section.sizes, section.sizes["steps"]
    recipe_args = ["recipe=llama31_8b", *sizes["trainrun"], f"max_duration={steps}ba", f"eval_interval={steps}ba"]
    recipe_args += ["checkpoint.interval=null", "export=false", "stop_at=null", "progress=false"]
    model, config, _ = stream_model(recipe_args)
    seq, llama = config.data.text.max_seq_len, config.model.llama
    tokens, flops = config.train_batch_size * seq, model_flops_per_token(llama, model, seq)

    def measure(side: str, compiled: str | None, out: Path, index: int) -> tuple[float, float | None]:
        if compiled is None:
            _, seconds, summary = section.trainrun(recipe_args, out)
            return median_step(seconds), summary.get("peak_memory_gb")
        result = section.side("trainer_llama", out, "--compile", compiled, "--steps", str(steps))
        return median_step(result["step_seconds"]), result["peak_gb"]

    sides = {"trainrun": None, "Trainer": "0", "Trainer, compiled": "1"}
    results = section.alternate(sides, args.rounds, measure)  # side -> (s a step, peak GB)
    rows = []
    for side, values in results.items():
        rate = tokens / statistics.median(v[0] for v in values)
        peaks = [v[1] for v in values if v[1] is not None]
        peak = f"{statistics.median(peaks):.1f}" if peaks else "-"
        rows.append([side, f"{rate:,.0f}", mfu(rate, flops, section.device), peak])
    print_table(
        f"llama: recipe=llama31_8b's settings on {sizes['trainrun'][0]} against Trainer with LlamaForCausalLM, "
        f"{config.train_batch_size} micro-batches of 1 x {seq} tokens a step, {steps} steps, on {device_name(section)}",
        ["side", "tokens/s", "MFU", "peak GB"],
        rows,
    )
    for side in ("Trainer", "Trainer, compiled"):
        if side in results and "trainrun" in results and len(results[side]) == len(results["trainrun"]):
            peer, ours = ([v[0] for v in results[name]] for name in (side, "trainrun"))
            print(f"llama: {side}'s step time / trainrun's: {ratio_text(peer, ours)}")


def trainer_llama_side(out: Path, device: str, scale: str, compile_model: bool, steps: int) -> None:
    """(Its own process.) Trainer trains ``LlamaForCausalLM`` at the section's shape on the same
    windows: each step's seconds and the peak memory, to ``out/result.json``."""
    from transformers import LlamaForCausalLM, Trainer

    from trainrun.models.llama_export import hf_llama_config

    sizes = SCALES[scale]["llama"]
    model, config, sets = stream_model(["recipe=llama31_8b", *sizes["trainrun"]])
    windows = sets.train.__getitems__(list(range(len(sets.train))))[:, :-1]
    samples = [{"input_ids": window, "labels": window} for window in windows]
    hf_config = hf_llama_config(config.model.llama, model.vocab_size)
    hf_config.use_cache = False
    llama = LlamaForCausalLM(hf_config)
    settings = trainer_arguments(
        out, device, sizes["bf16"], compile_model, per_device_train_batch_size=1,
        gradient_accumulation_steps=config.train_batch_size, max_steps=steps, learning_rate=config.optimizer.lr,
        adam_beta1=config.optimizer.betas[0], adam_beta2=config.optimizer.betas[1], adam_epsilon=config.optimizer.eps,
        weight_decay=config.optimizer.weight_decay, lr_scheduler_type="cosine", warmup_steps=max(1, steps // 10),
        max_grad_norm=1.0, gradient_checkpointing=True, dataloader_num_workers=4 if device == "cuda" else 0,
    )  # fmt: skip
    clock = step_clock_class()(device)
    Trainer(model=llama, args=settings, train_dataset=samples, callbacks=[clock]).train()
    peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
    (out / "result.json").write_text(json.dumps({"step_seconds": clock.steps, "peak_gb": peak}))


def trainer_arguments(out: Path, device: str, bf16: bool, compile_model: bool, **settings):
    """Trainer's settings as a user writes them for speed: bf16, fused AdamW on a GPU, no logging
    or saving, ``torch_compile`` as asked (traced with the eager backend on a CPU: the tiny scale
    checks the launch, not inductor's minutes)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out / "trainer"), bf16=bf16, optim="adamw_torch_fused" if device == "cuda" else "adamw_torch",
        torch_compile=compile_model, torch_compile_backend="inductor" if device == "cuda" else "eager",
        logging_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True,
        use_cpu=device != "cuda", dataloader_drop_last=True, dataloader_pin_memory=device == "cuda", **settings,
    )  # fmt: skip


def synchronised_clock(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def step_clock_class():
    """A ``TrainerCallback`` that times each optimizer step (end to end, loading included) and the
    training time at each evaluation (evaluations left out)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self, device: str) -> None:
            self.device, self.steps, self.evaluations = device, [], []
            self.last = self.started = self.evaluating = 0.0

        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ARG002
            self.last = self.started = synchronised_clock(self.device)

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ARG002
            now = synchronised_clock(self.device)
            self.steps.append(now - self.last)
            self.last = now

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):  # noqa: ANN001, ARG002
            now = synchronised_clock(self.device)  # the evaluation follows the step that ended last
            trained = self.last - self.started - self.evaluating
            self.evaluating += now - self.last
            self.last = now  # the next step's time leaves the evaluation out
            self.evaluations.append({"train_seconds": trained, "masked_accuracy": metrics["eval_accuracy"]})

    return Clock


# ---------------------------------------------------------------- BERT-Base against Trainer


def bert_run_args(sizes: dict, seed: int) -> list[str]:
    return ["recipe=bert_base", *sizes["trainrun"], f"max_duration={sizes['steps']}ba",
            f"eval_interval={sizes['eval_every']}ba", f"seed={seed}",
            "checkpoint.interval=null", "export=false", "stop_at=null", "progress=false"]  # fmt: skip


def compare_bert(section: Section, args: argparse.Namespace) -> None:
    sizes, curves = section.sizes, {}

    def measure(side: str, compiled: str | None, out: Path, index: int) -> tuple[float, float | None, float]:
        if compiled is None:
            evaluations, seconds, _ = section.trainrun(bert_run_args(sizes, index + 1), out)
        else:
            result = section.side("trainer_bert", out, "--compile", compiled, "--seed", str(index + 1))
            evaluations, seconds = result["evaluations"], result["step_seconds"]
        curves[f"{side}, seed {index + 1}"] = [f"{e['masked_accuracy']:.1%}" for e in evaluations]
        reached = next((e["train_seconds"] for e in evaluations if e["masked_accuracy"] >= args.bert_target), None)
        return median_step(seconds), reached, evaluations[-1]["masked_accuracy"]

    sides = {"trainrun": None, "Trainer": "0", "Trainer, compiled": "1"}
    results = section.alternate(sides, args.rounds, measure)  # side -> (s a step, s to target, accuracy)
    rows = []
    for side, values in results.items():
        reached = [v[1] for v in values if v[1] is not None]
        to_target = f"{statistics.median(reached):.1f}" if len(reached) == len(values) else "not reached"
        rate = sizes["batch"] / statistics.median(v[0] for v in values)
        rows.append([side, f"{rate:,.0f}", to_target, f"{statistics.median(v[2] for v in values):.2%}"])
    print_table(
        f"bert: recipe=bert_base against Trainer with BertForMaskedLM, batch {sizes['batch']}, {sizes['steps']} steps "
        f"on the built-in documents, evaluated every {sizes['eval_every']}, on {device_name(section)}",
        ["side", "seq/s", f"train s to {args.bert_target:.0%} masked accuracy", "final masked accuracy"],
        rows,
    )
    for name, curve in curves.items():
        print(f"bert: {name}: accuracy at each evaluation: {', '.join(curve)}")
    for side in ("Trainer", "Trainer, compiled"):
        if len(results.get(side, [])) == len(results.get("trainrun", [None])):
            peer, ours = ([v[0] for v in results[name]] for name in (side, "trainrun"))
            print(f"bert: {side}'s step time / trainrun's: {ratio_text(peer, ours)}")
            if all(v[1] for v in results[side] + results["trainrun"]):
                peer, ours = ([v[1] for v in results[name]] for name in (side, "trainrun"))
                print(f"bert: {side}'s time to {args.bert_target:.0%} / trainrun's: {ratio_text(peer, ours)}")


def trainer_bert_side(out: Path, device: str, scale: str, compile_model: bool, seed: int) -> None:
    """(Its own process.) Trainer trains ``BertForMaskedLM`` (the recipe's model before its methods'
    surgery, from the weights trainrun draws at ``seed``) on the run's samples with the recipe's
    masking, rates and schedule; each epoch evaluated on the held-out samples' fixed masks."""
    from peers_shared import bert_sets, bert_tokenizer, padded_samples
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, default_data_collator

    from trainrun.config import compose
    from trainrun.core.seeding import seed_everything
    from trainrun.models.build import build_model
    from trainrun.models.weights import export_pretrained
    from trainrun.validation import validate

    sizes = SCALES[scale]["bert"]
    run_args = bert_run_args(sizes, seed)
    config = validate(compose(run_args), files=False)
    sets = bert_sets(run_args)
    seed_everything(config.seed)
    export_pretrained(build_model(config.model, sets.text), sets.train.tokenizer_file, out / "initial")
    model = BertForMaskedLM.from_pretrained(out / "initial")
    held_out = [
        {key: sets.val[i][key] for key in ("input_ids", "attention_mask", "labels")} for i in range(len(sets.val))
    ]
    masking = DataCollatorForLanguageModeling(bert_tokenizer(sets.train), mlm_probability=sets.train.mlm_probability)

    def collate(features: list[dict]) -> dict:  # held-out samples keep their fixed masks
        return default_data_collator(features) if "labels" in features[0] else masking(features)

    def accuracy(prediction) -> dict:  # noqa: ANN001
        chosen = prediction.label_ids != -100
        return {"accuracy": float((prediction.predictions[chosen] == prediction.label_ids[chosen]).mean())}

    optimizer = config.optimizer
    settings = trainer_arguments(
        out, device, sizes["bf16"], compile_model, per_device_train_batch_size=sizes["batch"],
        per_device_eval_batch_size=sizes["batch"], max_steps=sizes["steps"], learning_rate=optimizer.lr,
        adam_beta1=optimizer.betas[0], adam_beta2=optimizer.betas[1], adam_epsilon=optimizer.eps,
        weight_decay=optimizer.weight_decay, lr_scheduler_type="linear", max_grad_norm=0.0,
        warmup_steps=max(1, round(0.06 * sizes["steps"])),
        eval_strategy="steps", eval_steps=sizes["eval_every"], dataloader_num_workers=sizes["workers"], seed=seed,
    )  # fmt: skip
    clock = step_clock_class()(device)
    Trainer(
        model=model, args=settings, train_dataset=padded_samples(sets.train), eval_dataset=held_out,
        data_collator=collate, compute_metrics=accuracy, callbacks=[clock],
        preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1),
    ).train()  # fmt: skip
    (out / "result.json").write_text(json.dumps({"step_seconds": clock.steps, "evaluations": clock.evaluations}))


# ---------------------------------------------------------------- ResNet-50 against Lightning


def compare_resnet(section: Section, args: argparse.Namespace) -> None:
    sizes, steps, batch = section.sizes, section.sizes["steps"], section.sizes["batch"]
    common = [*sizes["data"], f"train_batch_size={batch}", f"eval_batch_size={batch}", f"max_duration={steps}ba"]
    common += [f"eval_interval={steps}ba", f"precision={sizes['precision']}", "checkpoint.interval=null"]
    common += ["progress=false", "export=false", "data.val_samples=256"]
    sides = {
        "trainrun, channels-last": ["model=resnet50", "algorithms=[channels_last]", *common],
        "trainrun, mild": ["recipe=mild", *common],
        "Lightning": "lightning_resnet",
        "bare model step": "bare_resnet",
    }

    def measure(side: str, how: list[str] | str, out: Path, index: int) -> float:
        if isinstance(how, list):
            return median_step(section.trainrun(how, out)[1])
        return median_step(section.side(how, out)["step_seconds"])

    results = section.alternate(sides, args.rounds, measure)  # side -> s a step
    resolution = next(a for a in sizes["data"] if a.startswith("data.resolution=")).split("=")[1]
    print_table(
        f"resnet: ResNet-50 at {resolution} px, batch {batch}, {steps} steps, {sizes['precision']}, the same synthetic "
        f"images and loader settings, on {device_name(section)}",
        ["side", "images/s", "ms a step"],
        [
            [side, f"{batch / statistics.median(v):,.0f}", f"{1000 * statistics.median(v):.1f}"]
            for side, v in results.items()
        ],
    )
    ours = results.get("trainrun, channels-last", [])
    for side in ("Lightning", "bare model step"):
        if ours and len(results.get(side, [])) == len(ours):
            print(f"resnet: {side}'s step time / trainrun's (channels-last): {ratio_text(results[side], ours)}")


def resnet_setting(scale: str):
    """(the section's data config, batch, steps, precision)."""
    from trainrun.config import compose
    from trainrun.validation import validate

    sizes = SCALES[scale]["resnet"]
    config = validate(compose(["model=resnet50", *sizes["data"]]), files=False).data
    return config, sizes["batch"], sizes["steps"], sizes["precision"]


def lightning_resnet_side(out: Path, device: str, scale: str) -> None:
    """(Its own process.) Lightning's ``Trainer`` trains torchvision's ResNet-50 (channels-last,
    ``16-mixed`` where the section is amp) on the same synthetic images with the same loader
    settings; each step's seconds to ``out/result.json``."""
    import pytorch_lightning as pl
    import torchvision

    from trainrun.data.builtin import synthetic_datasets

    config, batch, steps, precision = resnet_setting(scale)
    images = synthetic_datasets(config).train
    workers = config.num_workers
    loader = torch.utils.data.DataLoader(
        images, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=device == "cuda",
        drop_last=True, persistent_workers=workers > 0,
    )  # fmt: skip
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torchvision.models.resnet50(num_classes=config.num_classes)
            self.model.to(memory_format=torch.channels_last)
            self.register_buffer("mean", mean)
            self.register_buffer("std", std)

        def training_step(self, batch, index):  # noqa: ANN001, ARG002
            images, labels = batch
            images = ((images.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
            return torch.nn.functional.cross_entropy(self.model(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.875, weight_decay=5e-5)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.steps, self.last = [], 0.0

        def on_train_start(self, trainer, module):  # noqa: ANN001, ARG002
            self.last = synchronised_clock(device)

        def on_train_batch_end(self, trainer, module, outputs, batch, index):  # noqa: ANN001, ARG002
            now = synchronised_clock(device)
            self.steps.append(now - self.last)
            self.last = now

    clock = Clock()
    trainer = pl.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        precision="16-mixed" if precision == "amp" else "32-true", callbacks=[clock],
    )  # fmt: skip
    trainer.fit(Classifier(), loader)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"step_seconds": clock.steps}))


def bare_resnet_side(out: Path, device: str, scale: str) -> None:
    """(Its own process.) torchvision's ResNet-50, channels-last, fp16 autocast with a gradient
    scaler where the section is amp, SGD, on one batch already on the device: the step the same
    kernels allow without loading; each step's seconds to ``out/result.json``."""
    import torchvision

    config, batch, steps, precision = resnet_setting(scale)
    model = torchvision.models.resnet50(num_classes=config.num_classes).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.875)
    amp = precision == "amp" and device == "cuda"
    scaler = torch.amp.GradScaler(device, enabled=amp)
    images = torch.randn(batch, 3, config.resolution, config.resolution, device=device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(config.num_classes, (batch,), device=device)
    seconds, last = [], synchronised_clock(device)
    for _ in range(steps):
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        now = synchronised_clock(device)
        seconds.append(now - last)
        last = now
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"step_seconds": seconds}))


# ---------------------------------------------------------------- the command

SECTIONS = {"gpt": compare_gpt, "bert": compare_bert, "llama": compare_llama, "resnet": compare_resnet}


def run_sections(args: argparse.Namespace) -> None:
    """``bench/peers.py --device cuda`` (or ``--scale tiny``): each section of ``args.only`` within
    ``--section-limit`` seconds, its table printed and written to ``args.out/peers_gpu.md``."""
    started = time.perf_counter()
    print(f"peers on {args.device} ({args.scale} scale), torch {torch.__version__}, {args.rounds} round(s)")
    for name in args.only:
        if name == "gpt" and args.nanogpt is None:
            print("gpt: skipped (give a nanoGPT checkout with --nanogpt DIR)\n")
            continue
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        section = Section(name, out, args.device, args.scale, time.monotonic() + args.section_limit)
        section_started = time.perf_counter()
        SECTIONS[name](section, args)
        print(f"{name}: {time.perf_counter() - section_started:.0f} s\n", flush=True)
    print(f"bench/peers.py: {time.perf_counter() - started:.0f} s")


def run_side(args: argparse.Namespace) -> None:
    """One peer's side in this process (``--side NAME``)."""
    args.out.mkdir(parents=True, exist_ok=True)
    if args.side == "trainer_llama":
        trainer_llama_side(args.out, args.device, args.scale, args.compile == 1, args.steps)
    elif args.side == "trainer_bert":
        trainer_bert_side(args.out, args.device, args.scale, args.compile == 1, args.seed)
    elif args.side == "lightning_resnet":
        lightning_resnet_side(args.out, args.device, args.scale)
    else:
        bare_resnet_side(args.out, args.device, args.scale)


def side_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one peer's side of bench/peers.py's GPU sections")
    parser.add_argument("--side", choices=["trainer_llama", "trainer_bert", "lightning_resnet", "bare_resnet"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", choices=list(SCALES), default="gpu")
    parser.add_argument("--compile", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


if __name__ == "__main__":
    run_side(side_arguments())
