"""trainrun estimate: a run's per-rank memory and step time at its real size, computed on this CPU.

Checked against what an H200 measured (docs/benchmarks.md's llama rows, read here), and by what it
says of the real-size recipe; plus the refusals and the exit code a script reads."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, run_here

from trainrun.commands import main
from trainrun.config import compose
from trainrun.validation import validate

ROOT = Path(__file__).resolve().parent.parent


def measured_peaks() -> dict[str, float]:
    """The H200's peak memory (GB) for llama3_1b at 2 x 4,096 tokens, bf16, from docs/benchmarks.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    peaks = {}
    for variant, key in (("whole (DDP's path), bf16", "ddp"), ("FSDP2 on a mesh of one, bf16", "fsdp")):
        row = re.search(rf"^\| {re.escape(variant)} \|.*\| ([\d.]+) \|$", text, re.MULTILINE)
        peaks[key] = float(row.group(1))
    return peaks


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_estimate_is_within_15_percent_of_the_h200s_measured_peak(parallel):
    from trainrun.estimate import estimate

    config = validate(
        compose(
            [
                "task=causal_lm",
                "data=stdlib_stream",
                "model=llama3_1b",
                "precision=bf16",
                "optimizer=adamw",
                "data.text.max_seq_len=4096",
                "train_batch_size=2",
                "eval_batch_size=2",
                "launcher.devices=1",
                f"parallel={parallel}",
            ]
        ),
        files=False,
    )
    result = estimate(config, vocab=8192)  # the bench's vocabulary
    measured = measured_peaks()[parallel]
    assert abs(result.peak_gb - measured) / measured < 0.15, (result.peak_gb, measured)
    # 1.0B weights: float32 weights, gradients and AdamW's two moments, whole on one rank
    assert result.held["weights"] == pytest.approx(3.96, abs=0.01)
    assert result.held["optimizer"] == pytest.approx(2 * result.held["weights"], rel=1e-3)
    # model FLOPs: 6 N + 12 L D T a token (N: the blocks' and head's weights), exactly
    blocks_and_head = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 8192 * 2048
    assert result.step_flops == (6 * blocks_and_head + 12 * 16 * 2048 * 4096) * 2 * 4096


def test_attention_dropout_keeps_no_scores_as_the_gpus_fused_kernel_does():
    """A GPU runs attention with a mask and dropout inside one fused kernel (memory-efficient or
    flash), which keeps its output and log-sum-exp; the CPU's fake pass would take the math path and
    keep a score matrix a step of it (BERT-Large's MLPerf recipe at 56 a GPU: 103 GB, not fitting an
    H100, where NVIDIA trained it on 80 GB A100s). The peak with attention dropout is the peak without."""
    from trainrun.estimate import estimate

    base = ["task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "data.text.max_seq_len=512", "precision=bf16"]
    base += ["train_batch_size=8", "eval_batch_size=8", "launcher.devices=1"]
    peaks = [
        estimate(validate(compose([*base, f"model.bert.attention_dropout={p}"]), files=False), vocab=8192).peak
        for p in (0.0, 0.1)
    ]
    assert peaks[0] == peaks[1]


def run_estimate(*arguments: str) -> subprocess.CompletedProcess:
    """``trainrun estimate ARGUMENTS`` in this process: its output and exit code are what is tested."""
    return run_here("estimate", *arguments)


def test_estimate_command_prints_json_and_exits_3_when_the_peak_does_not_fit():
    base = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "parallel=fsdp", "launcher.devices=4"]
    base += ["train_batch_size=8", "device_train_microbatch_size=1", "optimizer=adamw", "hardware=8xh100_aws"]
    fits = run_estimate(*base, "--json")
    assert fits.returncode == 0, fits.stderr
    result = json.loads(fits.stdout)
    assert result["ranks"] == 4 and result["passes"] == 2 and result["fits"] is True
    assert result["mesh"] == "shards over 4"
    assert result["vocab_size"] == 128_256  # Llama 3's tokenizer, where the run names no store
    tiny = run_estimate(*base, "hardware.device_memory_gb=0.001")
    assert tiny.returncode == 3 and "DOES NOT FIT" in tiny.stdout
    bad = run_estimate(*base, "--mfu", "1.5")
    assert bad.returncode == 2 and "--mfu" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_run_that_stops_at_its_target_is_never_priced_to_its_whole_schedule_as_its_cost():
    """With ``stop_at`` and no steps to it, the time and cost to ``max_duration`` are said to be the
    whole schedule's (``schedule_hours``/``schedule_cost`` in the JSON, the run's ``cost`` null);
    with ``--steps`` they are to the target, priced at those steps by value."""
    base = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "train_batch_size=8", "hardware=8xh100_aws"]
    base += ["launcher.devices=8", "max_duration=1000ba", "stop_at=3.3"]
    unknown = run_estimate(*base, "--json")
    assert unknown.returncode == 0, unknown.stderr
    schedule = json.loads(unknown.stdout)
    assert schedule["time_to"] == "schedule" and schedule["hours"] is None and schedule["cost"] is None
    hours = 1000 * schedule["step_seconds"] / 3600
    assert schedule["schedule_hours"] == pytest.approx(hours) and schedule["schedule_cost"] == pytest.approx(
        hours * 98.32
    )
    text = run_estimate(*base).stdout
    assert "to the end of the whole schedule, max_duration=1000ba, not the target (1,000 steps)" in text
    assert "note: the run stops at stop_at=3.3, whose steps are not known here" in text
    known = json.loads(run_estimate(*base, "--steps", "100", "--json").stdout)
    assert known["time_to"] == "target" and known["steps"] == 100 and "schedule_cost" not in known
    assert known["cost"] == pytest.approx(100 * known["step_seconds"] / 3600 * 98.32)
    assert "to the target (stop_at=3.3, --steps) (100 steps" in run_estimate(*base, "--steps", "100").stdout
    whole = json.loads(run_estimate(*base[:-1], "--json").stdout)  # no target: the schedule is the run
    assert whole["time_to"] == "schedule" and whole["cost"] == pytest.approx(hours * 98.32, rel=1e-6)


@pytest.mark.slow
def test_the_8b_recipe_fits_80gb_because_gradients_stay_sharded():
    """At its real size, estimated here: the per-rank peak is under 80 GB, and a rank's gradients
    between micro-batches are its shard (a whole float32 gradient would be 32 GB)."""
    # a process of its own: 24-27 s there, 30 s in the test's process (measured)
    result = run_cli("estimate", "recipe=llama31_8b", "launcher.devices=8", "hardware=8xh100_aws", "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["passes"] == 4 and estimate["vocab_size"] == 128_256
    assert estimate["held"]["gradients"] == pytest.approx(8.03e9 * 4 / 8 / 1e9, rel=0.01)
    assert estimate["peak_gb"] < 80 and estimate["fits"]
    # no whole float32 gradient (32 GB) among the step's temporaries: kept between micro-batches, it made
    # them 40.5 GB and the peak 86.2
    assert estimate["peak"].get("temp", 0.0) < 8 * estimate["held"]["gradients"]


@pytest.mark.slow
def test_auto_micro_batches_under_fsdp_are_decided_before_the_run_by_the_estimate(capsys):
    """A pass retried after running out of memory would leave the other ranks in a gather, so under
    fsdp ``auto`` takes the largest micro-batch the estimate fits in the device's memory, at once."""
    from trainrun.errors import ConfigError
    from trainrun.estimate import estimate
    from trainrun.launch import microbatch_before_start

    base = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "parallel=fsdp", "optimizer=adamw"]
    base += ["train_batch_size=8", "data.text.max_seq_len=64", "device_train_microbatch_size=auto", "device=cpu"]
    whole = estimate(validate(compose([*base, "device_train_microbatch_size=8"]), files=False))
    quarter = estimate(validate(compose([*base, "device_train_microbatch_size=2"]), files=False))
    between = (whole.peak_gb + quarter.peak_gb) / 2  # room for 2 samples a pass, not for 8 (nor 4, say)
    config = validate(compose([*base, f"hardware.device_memory_gb={between}"]), files=False)
    chosen = microbatch_before_start(config).device_train_microbatch_size
    assert chosen in ("2", "4") and "device_train_microbatch_size=auto under parallel=fsdp" in capsys.readouterr().err
    tiny = validate(compose([*base, "hardware.device_memory_gb=0.0001"]), files=False)
    with pytest.raises(ConfigError, match="not even one sample a pass fits"):
        microbatch_before_start(tiny)
    unknown = validate(compose(base), files=False)  # a CPU run without a memory to plan for: the whole batch
    assert microbatch_before_start(unknown).device_train_microbatch_size == "8"


def test_the_hardware_groups_peaks_are_the_gpu_benchs(monkeypatch):
    """One fact in two places: a group's bf16 and float32 peaks are the GPU bench's for its device."""
    import yaml

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from gpu_throughput import PEAK_TFLOPS

    peaks = {(half, fp32) for fp32, _tf32, half in PEAK_TFLOPS.values()}
    for path in sorted((ROOT / "conf" / "hardware").glob("*.yaml")):
        group = yaml.safe_load(path.read_text())
        if "peak_tflops" in group:
            assert (group["peak_tflops"], group["peak_fp32_tflops"]) in peaks, path.name


def test_grouped_query_attention_counts_its_flops_at_the_querys_heads():
    """Keys and values with fewer heads than the query count as the kernel broadcasts them (torch
    2.11's formulas refused unequal heads: trainrun estimate failed for every Llama there)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from trainrun.estimate.flops import flop_formulas

    query = torch.randn(2, 8, 64, 16, requires_grad=True)
    keys, values = torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16)
    counts = []
    for grouped in (True, False):
        k, v = (keys, values) if grouped else (keys.repeat_interleave(4, 1), values.repeat_interleave(4, 1))
        with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as counter:
            F.scaled_dot_product_attention(query, k, v, is_causal=True, enable_gqa=grouped).sum().backward()
        counts.append(counter.get_flop_counts()["Global"])
    assert counts[0] == counts[1] and sum(counts[0].values()) > 0


def test_attention_counts_model_flops_its_backward_twice_its_forward_by_value():
    """The two products of attention, 2 x (2 B H T T D) forward, and their gradients with respect to
    both operands, twice that, backward (the kernel's recompute of the scores is not the model's)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from trainrun.estimate.flops import flop_formulas

    batch, heads, tokens, width = 2, 8, 64, 16
    query = torch.randn(batch, heads, tokens, width, requires_grad=True)
    keys, values = (torch.randn(batch, 2, tokens, width, requires_grad=True) for _ in range(2))
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as counter:
        F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True).sum().backward()
    (counts,) = [counter.get_flop_counts()["Global"]]
    forward = 2 * (2 * batch * heads * tokens * tokens * width)
    assert {str(op).removeprefix("aten.").removesuffix(".default"): count for op, count in counts.items()} == {
        "_scaled_dot_product_flash_attention_for_cpu": forward,
        "_scaled_dot_product_flash_attention_for_cpu_backward": 2 * forward,
    }


def test_a_grouped_product_counts_the_flops_of_its_groups_products_and_their_gemm():
    """An expert's grouped product (forward, its input's and its weights' gradients) counts what the
    same products a group at a time count (torch's formulas count none), and is timed as a group's GEMM."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from trainrun.estimate.flops import flop_formulas
    from trainrun.estimate.operations import MATMUL, kind_of

    tokens, experts, width, out = 48, 3, 16, 8
    offsets = torch.tensor([16, 32, 48], dtype=torch.int32)
    counts = []
    for grouped in (True, False):
        rows = torch.randn(tokens, width, requires_grad=True)
        weights = torch.randn(experts, width, out, requires_grad=True)
        with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as counter:
            if grouped:
                products = torch.nn.functional.grouped_mm(rows, weights, offs=offsets)
            else:
                products = torch.cat([rows[16 * e : 16 * (e + 1)] @ weights[e] for e in range(experts)])
            products.backward(torch.ones(tokens, out))
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 3 * 2 * tokens * width * out
    product = torch.empty(tokens, out)
    assert kind_of(torch.ops.aten._grouped_mm, (rows, weights, offsets), product) == (MATMUL, (16, out, width))
    gradient = torch.empty(experts, width, out)
    assert kind_of(torch.ops.aten._grouped_mm, (rows.T, product, offsets), gradient) == (MATMUL, (width, out, 16))


def test_a_grouped_product_runs_as_torchs_grouped_kernel_or_its_loop_of_one_product_a_group():
    """One kernel for bf16 on a GPU with torch's grouped kernel; elsewhere, or in float32, the host
    waits for the groups' sizes, then issues a product a group, which no queued kernel hides."""
    import torch

    from trainrun.estimate.device import device_of
    from trainrun.estimate.operations import MATMUL, SYNC, Operation, OperationLog

    rows, weights = torch.randn(48, 16), torch.randn(3, 16, 8)
    offsets = torch.tensor([16, 32, 48], dtype=torch.int32)
    logged = {}
    for grouped_kernel, dtype in ((True, torch.bfloat16), (False, torch.bfloat16), (True, torch.float32)):
        with OperationLog(grouped_kernel=grouped_kernel) as log:
            torch.nn.functional.grouped_mm(rows.to(dtype), weights.to(dtype), offs=offsets)
        logged[grouped_kernel, dtype] = [(op.kind, op.flops) for op in log.operations if op.flops or op.kind == SYNC]
    product = 2 * 48 * 16 * 8
    assert logged[True, torch.bfloat16] == [(MATMUL, product)]
    assert logged[False, torch.bfloat16] == logged[True, torch.float32] == [(SYNC, 0), *[(MATMUL, product / 3)] * 3]

    device = device_of(validate(compose(["hardware=8xh100_aws"]), files=False))
    long, short = Operation(1e13, 0.0, MATMUL, (8192, 8192, 8192)), Operation(0.0, 1e3)
    issue, kernel = device.issue_seconds(), device.operation_seconds
    assert device.seconds([long, short, short]) == pytest.approx(issue + kernel(long) + 2 * kernel(short))
    waited = device.seconds([long, Operation(0.0, 0.0, SYNC), short, short])
    assert waited == pytest.approx(issue + kernel(long) + 2 * issue + kernel(short))


def test_a_mixture_of_experts_is_estimated_with_its_experts_products():
    """A transformers mixture of experts (its experts one grouped product, which the fake pass's meta
    kernels take only in bf16 or fp16) is estimated, its step counting each token's experts: two
    experts a token cost one expert's 6 x its weights a token more than one."""
    from trainrun.estimate import estimate

    args = ["task=causal_lm", "data=stdlib_stream", "model=transformers", "model.arch=qwen3_moe",
            "model.config.hidden_size=64", "model.config.num_hidden_layers=2", "model.config.num_attention_heads=2",
            "model.config.num_key_value_heads=1", "model.config.num_local_experts=4",
            "model.config.moe_intermediate_size=32", "data.text.max_seq_len=64", "train_batch_size=4",
            "launcher.devices=1", "precision=bf16", "hardware=8xh100_aws"]  # fmt: skip
    flops = [estimate(validate(compose([*args, f"model.config.num_experts_per_tok={k}"]), files=False), vocab=256)
             for k in (1, 2)]  # fmt: skip
    expert = 3 * 64 * 32  # gate, up and down projections
    assert flops[1].step_flops - flops[0].step_flops == 6 * 2 * expert * 4 * 64


def test_an_evaluation_that_hands_a_view_of_a_weight_to_a_module_is_estimated():
    """PiT hands its class token, expanded to the batch, to its transformer stages: a view of a weight,
    which under no_grad alone still requires a gradient (torch's memory tracker refused it)."""
    from trainrun.estimate import estimate

    args = ["model=timm", "model.arch=pit_ti_224", "data=synthetic", "data.resolution=64", "data.eval_resolution=64",
            "data.samples=[1000,100]", "max_duration=1ep", "train_batch_size=8", "launcher.devices=1",
            "hardware=8xh100_aws"]  # fmt: skip
    result = estimate(validate(compose(args), files=False))
    assert 0 < result.eval_peak_gb < result.peak_gb


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_a_steps_flops_are_the_models_whatever_is_recomputed(checkpointing):
    """6 N + 12 L D T a token, exactly, for a small Llama, with activation checkpointing's recompute
    left out of the count (a run's MFU is of model FLOPs)."""
    from trainrun.estimate import estimate

    args = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "data.text.max_seq_len=128"]
    args += ["train_batch_size=4", "launcher.devices=1", f"parallel.activation_checkpointing={checkpointing}"]
    result = estimate(validate(compose(args), files=False), vocab=512)
    layers, width, kv_width, ffn, vocab, tokens = 2, 128, 64, 384, 512, 128
    blocks_and_head = layers * (2 * width * width + 2 * width * kv_width + 3 * width * ffn) + width * vocab
    assert result.step_flops == (6 * blocks_and_head + 12 * layers * width * tokens) * 4 * tokens


def test_each_method_changes_a_steps_work_where_it_acts_along_the_schedule():
    """The methods' own schedules, read by the estimate: progressive resizing's sides (from FixRes's
    training side), ColOut's kept rows and columns, selective backprop's scoring and kept share
    inside its window, SAM's second pass every interval, sequence-length warmup's lengths."""
    from trainrun.algorithms.specs import SPECS
    from trainrun.core.work import StepWork
    from trainrun.estimate.schedule import phases_of
    from trainrun.schema import TrainConfig

    def config(**methods):
        return TrainConfig(algorithms={name: SPECS[name].config(**params) for name, params in methods.items()})

    images = StepWork(full_resolution=224, resolution=224)
    resized = phases_of(config(fixres={"train_resolution": 176}, progressive_resizing={}), images)
    assert (resized[0][:2], resized[0][2].resolution) == ((0.0, 0.4), 88)  # half of FixRes's 176 until 40 %
    assert (resized[-1][:2], resized[-1][2].resolution) == ((0.8, 1.0), 176)  # full size for the last 20 %
    assert [phase[2].resolution for phase in resized] == sorted(phase[2].resolution for phase in resized)
    ((_, _, cut),) = phases_of(config(colout={"p_row": 0.15, "p_col": 0.15}), images)
    assert cut.pixel_share == pytest.approx(190 * 190 / 224**2)  # int(0.85 x 224) rows and columns kept
    ((_, _, sam),) = phases_of(config(sam={"interval": 10}), images)
    assert sam.extra_passes == pytest.approx(0.1)
    selective = phases_of(config(selective_backprop={"keep": 0.5, "interval": 4, "scale_factor": 0.5}), images)
    assert [phase[:2] for phase in selective] == [(0.0, 0.5), (0.5, 0.9), (0.9, 1.0)]
    inside = selective[1][2]
    assert inside.trained_share == pytest.approx(1 - 0.75 * 0.5)  # 3 batches in 4 keep half
    assert inside.scored_share == pytest.approx(0.75 * 0.25)  # scored at half the side
    assert selective[0][2].trained_share == selective[2][2].trained_share == 1.0
    text = StepWork(sequence_length=512)
    warmup = phases_of(config(seq_length_warmup={"duration": 0.5, "min_seq_length": 8, "max_seq_length": 512}), text)
    # read at the middle of the first fiftieth: 8 + 8 x floor(0.01 / 0.5 x 63) tokens
    assert warmup[0][2].sequence_length == 16 and warmup[-1][2].sequence_length == 512
    assert warmup[-1][:2] == (0.5, 1.0)


def test_the_sliding_windows_of_a_case_are_monais_at_half_overlap_with_every_mirror():
    from trainrun.schema import DataConfig, SegmentationDataConfig
    from trainrun.tasks.segmentation import Segmentation

    def task(patch, mirrors):
        settings = SegmentationDataConfig(patch_size=patch, mirror_axes=mirrors)
        return Segmentation(DataConfig(name="synthetic_brats", num_classes=4, segmentation=settings))

    # 138 and 169 voxels over 128 at a stride of 64: two windows an axis; 8 mirrored passes each
    assert task([128, 128, 128], [0, 1, 2]).windows_a_case([138, 169, 138]) == 2 * 2 * 2 * 8
    # a 2D model: every axial slice's windows (240 over 192 at 96: 2; over 160 at 80: 2), mirrored on 2 axes
    assert task([192, 160], [1, 2]).windows_a_case([155, 240, 240]) == 155 * 2 * 2 * 4


@pytest.mark.slow
def test_a_progressive_resizing_run_on_few_cores_is_loader_bound_early_and_gpu_bound_late():
    """mild on a p4d.24xlarge (48 cores for FFCV's 64 threads): at 88 px the GPUs wait for the decode
    (whose cost hardly depends on the side), at 176 px the decode waits for the GPUs; the time
    is the operations' on the A100's datasheet over ImageNet's epochs."""
    result = run_estimate("recipe=mild", "launcher.devices=8", "hardware=8xa100_aws", "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["bottlenecks"] == ["loader", "GPU"]
    assert (
        estimate["rate_basis"] == "datasheet, fitted generation (ampere)"
        and "a100 from the datasheet" in estimate["rate"]
    )
    assert estimate["schedule_steps"] == 90 * (1_281_167 // 2048) and estimate["evaluations"] == 90
    first, last = estimate["phases"][0], estimate["phases"][-1]
    assert (first["resolution"], last["resolution"]) == (88, 176)
    assert first["seconds"] == first["loader_seconds"]
    assert last["seconds"] == pytest.approx(last["gpu_seconds"] + last["exposed_link_seconds"])
    train = sum((p["end"] - p["start"]) * estimate["schedule_steps"] * p["seconds"] for p in estimate["phases"])
    assert estimate["hours"] == pytest.approx((train + 90 * estimate["eval_seconds"]) / 3600)
    more = ["hardware.cpu_cores=96", "hardware.cpu_threads=192", "hardware.cpu_speed=2"]
    plenty = run_estimate("recipe=mild", "launcher.devices=8", "hardware=8xa100_aws", *more, "--json")
    plenty = json.loads(plenty.stdout)
    assert plenty["bottlenecks"] == ["GPU"] and plenty["hours"] < estimate["hours"]


@pytest.mark.slow
def test_an_evaluation_is_the_slower_of_its_forward_passes_and_its_images_through_the_loaders():
    """hot on a p4d evaluates ImageNet's 50,000 validation images every epoch: decoding them at 224 px
    on the loaders' threads (at the efficiency a node's image workers reach) takes longer than their
    forward passes, so each evaluation is the loaders' time, and the output says so; with CPUs to
    spare it is the GPUs' again. A run that evaluates once at the end (eval_interval=1dur) pays one."""
    from trainrun.core.work import StepWork
    from trainrun.estimate.datasheets import rates
    from trainrun.estimate.loader import evaluation_loader_seconds, image_seconds, loader_threads

    config = loader_config("data.num_workers=8")
    threads = loader_threads(config, 8) * rates().cpu.image_loader_efficiency
    expected = 50_000 * image_seconds(config, StepWork(224, 224)) / threads
    assert 0 < rates().cpu.image_loader_efficiency <= 1
    assert evaluation_loader_seconds(config, loader_threads(config, 8)) == pytest.approx(expected)
    base = ["recipe=hot", "data.num_workers=8", "launcher.devices=8", "hardware=8xa100_aws"]
    estimate = json.loads(run_estimate(*base, "--json").stdout)
    assert estimate["eval_loader_seconds"] == pytest.approx(expected, rel=1e-3)
    assert estimate["eval_gpu_seconds"] < estimate["eval_loader_seconds"] == estimate["eval_seconds"]
    text = run_estimate(*base).stdout
    assert f"(GPUs {estimate['eval_gpu_seconds']:.1f} s, loaders {expected:.1f} s): loader-bound" in text
    plenty = json.loads(run_estimate(*base, "hardware.cpu_speed=20", "--json").stdout)
    assert plenty["eval_seconds"] == plenty["eval_gpu_seconds"] > plenty["eval_loader_seconds"]
    once = run_estimate(*base, "eval_interval=1dur")
    assert "steps and 1 evaluation)" in once.stdout, once.stdout


@pytest.mark.slow
def test_a_methods_work_beside_the_passes_is_its_operations_spread_over_its_interval():
    """EMA's update of its average (every 20 steps in mild and hot), MixUp's blend and ColOut's slice
    (every step) run on the device besides the model's passes: each is its operations, run once on the
    rank's fake weights and a batch of the run's shape, timed one by one and spread over its interval;
    an update reads the average and the weights and writes the average."""
    base = ["recipe=mild", "launcher.devices=8", "hardware=8xa100_aws"]
    with_ema = json.loads(run_estimate(*base, "--json").stdout)
    without = json.loads(run_estimate(*base, "~algorithms.ema", "--json").stdout)
    (note,) = [note for note in with_ema["notes"] if note.startswith("ema: ")]
    assert "every 20 steps on each rank" in note
    per_step = float(re.search(r"\(([\d.]+) ms a step\)", note).group(1)) / 1e3
    moved, weights = float(re.search(r"([\d.]+) GB moved", note).group(1)), with_ema["held"]["weights"]
    assert 3 * weights <= moved <= 3.5 * weights
    for phase, plain in zip(with_ema["phases"], without["phases"], strict=True):
        assert phase["gpu_seconds"] - plain["gpu_seconds"] == pytest.approx(per_step, abs=2e-6)
    hot = json.loads(run_estimate("recipe=hot", "launcher.devices=8", "hardware=8xa100_aws", "--json").stdout)
    found = {note.split(":")[0]: note for note in hot["notes"] if note.startswith(("ema: ", "mixup: ", "colout: "))}
    assert set(found) == {"ema", "mixup", "colout"}
    assert "every step" in found["mixup"] and "every step" in found["colout"]


@pytest.mark.slow
def test_a_budget_is_timed_as_the_steps_its_training_seconds_buy():
    """A wall-clock or money budget trains for the steps its seconds buy at the schedule's mean step
    (the run re-plans to them), its evaluations on top; its methods' intervals in batches are timed."""
    base = ["recipe=mild", "launcher.devices=8", "hardware=8xa100_aws", "--json"]
    fixed = json.loads(run_estimate(*base).stdout)
    mean = sum((phase["end"] - phase["start"]) * phase["seconds"] for phase in fixed["phases"])
    per_epoch = 1_281_167 // 2048  # ImageNet's training images at mild's batch
    for budget, seconds in (("2h", 7200), ("50usd", 50 / 32.77 * 3600)):  # the group's price a node-hour
        estimate = json.loads(run_estimate(*base, f"max_duration={budget}").stdout)
        assert estimate["steps"] == estimate["schedule_steps"] == int(seconds / mean)
        assert estimate["evaluations"] == math.ceil(estimate["steps"] / per_epoch)  # every epoch and at the end
        evaluating = estimate["evaluations"] * estimate["eval_seconds"]
        assert estimate["hours"] * 3600 == pytest.approx(seconds + evaluating, rel=1e-3)
    (ema,) = [note for note in estimate["notes"] if note.startswith("ema: ")]
    assert "every 20 steps" in ema  # 20 batches need no length


def test_a_target_past_the_schedule_is_timed_to_the_schedules_end():
    """Steps to the target past ``max_duration`` (or past what a budget buys) are never trained: the
    run is timed to its end, said short of the target; ``--steps`` without ``stop_at`` too."""
    base = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "train_batch_size=32", "max_duration=1000ba"]
    base += ["hardware=8xh100_aws", "launcher.devices=8", "--json"]
    aimed = [*base, "stop_at=3.0", "target_samples=64000"]  # 2,000 steps of 32
    reached = json.loads(run_estimate(*aimed, "max_duration=4000ba").stdout)
    assert reached["time_to"] == "target" and reached["steps"] == 2000 and reached["short_of_target"] is None
    for short in ("max_duration=1000ba", "max_duration=1s"):
        ended = json.loads(run_estimate(*aimed, short).stdout)
        assert ended["time_to"] == "schedule" and ended["short_of_target"] == 2000
        assert ended["steps"] == ended["schedule_steps"] < 2000 and ended["hours"] < reached["hours"]
        (note,) = [note for note in ended["notes"] if "are past" in note]
        assert note.startswith("the target's 2,000 steps (target_samples=64,000) are past max_duration=")
    given = json.loads(run_estimate(*base, "--steps", "5000").stdout)
    assert given["steps"] == 1000 and given["short_of_target"] == 5000 and given["hours"] is not None


@pytest.mark.slow
def test_overrides_may_come_after_the_flags():
    result = run_estimate("recipe=mild", "--json", "launcher.devices=8", "~algorithms.ema")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["ranks"] == 8 and not any(note.startswith("ema: ") for note in estimate["notes"])


@pytest.mark.slow
def test_a_recipe_with_published_samples_to_its_target_is_timed_to_the_target():
    result = run_estimate("recipe=bert_large", "launcher.devices=8", "hardware=8xa100_80gb", "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["time_to"] == "target" and estimate["steps"] == math.ceil(643_000 / 448)
    assert estimate["target_source"] == "target_samples=643,000" and estimate["cost"] is None  # no price set
    assert estimate["real_token_share"] == 1.0  # no store named: every position assumed a token, and said
    half = json.loads(run_estimate("recipe=bert_large", "launcher.devices=8", "--real-tokens", "0.5", "--json").stdout)
    assert half["phases"][0]["step_flops"] < 0.6 * estimate["phases"][0]["step_flops"]  # unpadding's saving


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        (["--real-tokens", "0"], "--real-tokens"),
        (["--real-tokens", "1.5"], "--real-tokens"),
        (["--case-shape", "0", "64", "64"], "--case-shape"),
        (["data.samples=[10]"], "data.samples"),
        (["hardware.cpu_cores=0"], "hardware.cpu_cores"),
        (["hardware.gpu=h10"], "hardware"),  # a GPU without its datasheet: not 40 % assumed
        (["hardware.architecture=hoper"], "hardware.architecture"),
        (["--real-tokens", "0.5"], "--real-tokens"),  # a causal LM pads nothing
        (["--case-shape", "64", "64", "64"], "--case-shape"),  # nor has it cases to window
        (["train_batch_size=12", "hardware=8xh100_aws"], "train_batch_size"),  # auto: the node's 8 GPUs, said
    ],
)
def test_bad_estimate_input_is_one_line_naming_it(arguments, key):
    result = run_estimate("task=causal_lm", "data=stdlib_stream", "model=llama_tiny", *arguments)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"'{key}'" in result.stderr
    if "hardware=8xh100_aws" in arguments:  # processes the user never named: where they came from
        assert "launcher.devices=auto is 8xh100_aws's 8 GPUs; set it for fewer" in result.stderr


def test_each_generation_is_fitted_on_its_declared_fit_set_and_no_prediction_row():
    """hopper's shares are fitted on trainrun's readings marked ``fit`` and nothing else; every other
    fitted generation on the one published row that declares it (``fits``); no other row of the
    published table is read by a fit, and a reading kept out of the fit says why."""
    import yaml

    from trainrun.estimate.datasheets import rates
    from trainrun.estimate.device import generations

    fitted, readings = generations(), rates().gpu
    keys = [(row.key(), row.gpu) for row in readings]
    assert len(keys) == len(set(keys))
    assert list(fitted["hopper"].fitted_on) == [f"{row.gpu}: {row.key()}" for row in readings if row.fit]
    assert all(row.why for row in readings if not row.fit)
    published = yaml.safe_load((ROOT / "bench" / "published_times.yaml").read_text())["rows"]
    declared = {row["id"]: row["fits"] for row in published if "fits" in row}
    for name, generation in fitted.items():
        if name == "hopper":
            continue
        (source,) = [row_id for row_id, fits in declared.items() if fits == name]  # at most one a generation
        assert [entry.split(":")[0] for entry in generation.fitted_on] == [source]
    assert set(declared.values()) == set(fitted) - {"hopper"}


def test_a_gpu_is_timed_from_its_datasheet_and_one_without_it_is_refused_in_one_line(tmp_path):
    """A group of the user's own that states a GPU's datasheet and no reading is timed from it, saying
    so; one that names a GPU without those facts is refused naming the missing ones, and one whose
    tensor cores' full rate is below its peak naming that key."""
    group = tmp_path / "hardware" / "mygpu.yaml"
    group.parent.mkdir()
    datasheet = ["device_memory_gb: 48", "peak_tflops: 362", "memory_gb_s: 864", "architecture: turing"]
    node = ["cpu_cores: 32", "cpu_speed: 1.0", "devices: 1"]
    group.write_text("\n".join(["name: mygpu", "gpu: l40s", *datasheet, *node]) + "\n")
    args = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "precision=bf16", "-cd", str(tmp_path)]
    args += ["hardware=mygpu"]
    result = run_estimate(*args, "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["rate_basis"] == "datasheet, unfitted generation (turing: ampere's shares)"
    assert "l40s from the datasheet: 362 TFLOP/s" in estimate["rate"] and estimate["step_seconds"] > 0
    assert "ampere's shares (fitted on " in estimate["rate"] and "; turing has no fit of its own)" in estimate["rate"]
    group.write_text("\n".join(["name: mygpu", "gpu: l40s", "peak_tflops: 362", *node]) + "\n")
    refused = run_estimate(*args)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "mygpu names gpu l40s but states no memory_gb_s, device_memory_gb, architecture" in refused.stderr
    group.write_text("\n".join(["name: mygpu", "gpu: l40s", *datasheet, "peak_fp16_accumulate_tflops: 181", *node]))
    below = run_estimate(*args)
    assert below.returncode == 2 and len(below.stderr.strip().splitlines()) == 1
    assert "'hardware.peak_fp16_accumulate_tflops': 181 is below peak_tflops 362" in below.stderr


def test_every_shipped_group_states_its_gpus_datasheet():
    """Each shipped group's memory, generation and, on a GeForce part, its tensor cores' full rate are
    its vendor's datasheet's (its peaks: the test above, against the GPU bench's table)."""
    import yaml

    datasheets = {  # GB/s by memory size (GB), architecture
        "a100": ({40: 1555, 80: 2039}, "ampere"),
        "h100": ({80: 3350}, "hopper"),
        "h200": ({141: 4800}, "hopper"),
        "b200": ({180: 8000}, "blackwell"),
        "mi355x": ({288: 8000}, "cdna4"),
        "rtx3090": ({24: 936}, "ampere"),
        "rtx4090": ({24: 1008}, "ada"),
        "rtx5090": ({32: 1792}, "rtx_blackwell"),
    }
    # a GeForce part's FP16-accumulate rate: twice its peak
    full_rates = {"rtx3090": 142.0, "rtx4090": 330.3, "rtx5090": 419.0}
    for path in sorted((ROOT / "conf" / "hardware").glob("*.yaml")):
        group = yaml.safe_load(path.read_text())
        if "gpu" not in group:
            continue
        bandwidths, architecture = datasheets[group["gpu"]]
        assert group["architecture"] == architecture, path.name
        assert group["memory_gb_s"] == bandwidths[group["device_memory_gb"]], path.name
        assert group.get("peak_fp16_accumulate_tflops") == full_rates.get(group["gpu"]), path.name


def test_the_steps_to_a_target_can_come_from_finished_runs_of_the_recipe(tmp_path):
    """``--from-runs``: the median samples that runs of the same recipe and stop_at took, as their
    summaries say; runs of another recipe or that never reached the target are not read as such."""
    from conftest import TINY

    tiny = [*TINY, "name=tiny", "max_duration=3ep", "device=cpu"]
    for seed, stop_at in ((0, "0.05"), (1, "0.05"), (2, "0.999")):
        run = run_here(*tiny, f"seed={seed}", f"stop_at={stop_at}", f"hydra.run.dir={tmp_path / f'run{seed}'}")
        assert run.returncode == 0, run.stderr
    reached = [json.loads((tmp_path / f"run{seed}" / "summary.json").read_text()) for seed in (0, 1)]
    assert all(summary["status"] == "target_reached" for summary in reached)
    median = sorted(summary["samples"] for summary in reached)[0] / 2 + sorted(s["samples"] for s in reached)[1] / 2
    estimate = run_estimate(*tiny, "stop_at=0.05", "--from-runs", str(tmp_path), "--json")
    assert estimate.returncode == 0, estimate.stderr
    result = json.loads(estimate.stdout)
    assert result["time_to"] == "target" and result["steps"] == math.ceil(median / 64)
    assert result["target_source"] == f"the median of 2 finished run(s): {median:,.0f} samples"
    never = run_estimate(*tiny, "stop_at=0.5", "--from-runs", str(tmp_path))
    assert never.returncode == 2 and "no run of tiny under" in never.stderr and "stop_at=0.5" in never.stderr
    # skewed samples (the median is not the mean) and a run of the same recipe and stop_at that ended
    # without reaching it (its samples are the schedule's, not the target's): the median of the three
    reached_samples = [summary["samples"] for summary in reached]
    far = 50 * max(reached_samples)
    for name, samples, status in (("far", far, "target_reached"), ("unfinished", 1000 * far, "completed")):
        shutil.copytree(tmp_path / "run0", tmp_path / name)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        (tmp_path / name / "summary.json").write_text(json.dumps(summary | {"samples": samples, "status": status}))
    skewed = run_estimate(*tiny, "stop_at=0.05", "--from-runs", str(tmp_path), "--json")
    assert skewed.returncode == 0, skewed.stderr
    middle = sorted([*reached_samples, far])[1]
    result = json.loads(skewed.stdout)
    assert result["steps"] == math.ceil(middle / 64)
    assert result["target_source"] == f"the median of 3 finished run(s): {middle:,.0f} samples"


@pytest.mark.slow
def clear_lead(best: dict, second: dict, key: str, more: bool = False) -> bool:
    """Whether ``best`` leads ``second`` in ``key`` by more than the larger of their validation errors."""
    if best["error"] is None or second["error"] is None:
        return False
    margin = 1 + max(best["error"], second["error"])
    return best[key] > second[key] * margin if more else second[key] > best[key] * margin


def test_compare_puts_the_run_on_each_hardware_option_and_node_count_in_one_table():
    """``--compare``: each option at its node's GPUs (``launcher.devices=auto``, as a plain estimate on
    that group), ``--nodes`` on each; every figure is the estimate of that option alone, with how its
    GPUs were timed; the fastest and the cheapest marked, or under a budget the option it buys the
    most steps on, each only where it leads the next by more than the validation's error for how the
    two were timed."""
    base = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "train_batch_size=32", "max_duration=1000ba"]
    result = run_estimate(*base, "--compare", "8xa100_aws,8xh100_aws", "--nodes", "1,2", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(row["hardware"], row["nodes"]): row for row in json.loads(result.stdout)}
    assert sorted(rows) == [("8xa100_aws", 1), ("8xa100_aws", 2), ("8xh100_aws", 1), ("8xh100_aws", 2)]
    assert [rows[key]["ranks"] for key in sorted(rows)] == [8, 16, 8, 16]
    alone = json.loads(run_estimate(*base, "hardware=8xh100_aws", "--json").stdout)  # auto: the node's 8 GPUs
    assert alone["ranks"] == 8
    assert rows[("8xh100_aws", 1)]["hours"] == pytest.approx(alone["hours"])
    assert rows[("8xh100_aws", 1)]["cost"] == pytest.approx(alone["hours"] * 98.32)
    assert rows[("8xh100_aws", 2)]["cost"] == pytest.approx(rows[("8xh100_aws", 2)]["hours"] * 98.32 * 2)
    assert rows[("8xh100_aws", 1)]["hours"] < rows[("8xa100_aws", 1)]["hours"]
    table = run_estimate(*base, "--compare", "8xa100_aws,8xh100_aws").stdout.splitlines()
    one_node = [row for row in rows.values() if row["nodes"] == 1]
    marks = {line.split(" | ")[0].strip("| "): line.rsplit("|", 2)[1] for line in table if line.startswith("| 8x")}
    for mark, key in (("fastest", "hours"), ("cheapest", "cost")):
        best, second = sorted(one_node, key=lambda row: row[key])[:2]
        assert (mark in marks[best["hardware"]]) == clear_lead(best, second, key), mark
        assert mark not in marks[second["hardware"]]
    assert all(row["basis"].startswith(("measured", "datasheet")) for row in rows.values())
    assert all(row["steps"] == 1000 for row in rows.values())
    budget = [*base[:-1], "max_duration=30min", "--compare", "8xa100_aws,8xh100_aws", "--nodes", "1,2"]
    bought = {(row["hardware"], row["nodes"]): row for row in json.loads(run_estimate(*budget, "--json").stdout)}
    for hardware in ("8xa100_aws", "8xh100_aws"):  # the same half hour: scaling is steps a node-hour
        one, two = bought[(hardware, 1)], bought[(hardware, 2)]
        assert two["scaling"] == pytest.approx(two["steps"] / (2 * two["hours"]) / (one["steps"] / one["hours"]))
    most, next_most = sorted(bought.values(), key=lambda row: -row["steps"])[:2]
    table = run_estimate(*budget).stdout.splitlines()
    marked = [line for line in table if line.endswith("most steps |")]
    lead = clear_lead(most, next_most, "steps", more=True)
    assert marked == (
        [line for line in table if line.startswith(f"| {most['hardware']} | {most['nodes']} |")] if lead else []
    )
    assert "fastest" not in "".join(table)
    for arguments, key in ((["--compare", "8xnone"], "--compare"), (["--nodes", "2"], "--nodes")):
        refused = run_estimate(*base, *arguments)
        assert refused.returncode == 2 and f"'{key}'" in refused.stderr and refused.stderr.count("\n") == 1


def test_gradients_and_shards_crossing_gpus_and_nodes_are_timed_at_the_hardwares_links():
    """As NCCL runs them, at its share of each link and a latency a collective: DDP all-reduces the
    float32 gradients once a step in 25 MB buckets (2 (n-1)/n of them a GPU over NVLink, a node's share
    across nodes over its network's share a GPU) behind the backward; FSDP2 gathers the bf16 weights
    twice and reduce-scatters the float32 gradients every micro-batch, behind the whole step."""
    from trainrun.estimate.exchange import BUCKET_BYTES, BUS_EFFICIENCY, COLLECTIVE_LATENCY_S

    base = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "train_batch_size=64", "max_duration=100ba"]
    base += ["hardware=8xa100_aws", "launcher.devices=8", "precision=bf16"]
    runs = {
        "ddp": [],
        "ddp_2_nodes": ["launcher.nnodes=2"],  # sized, never launched: no rendezvous asked
        "fsdp": ["parallel=fsdp", "device_train_microbatch_size=4"],
    }
    found = {}
    for name, extra in runs.items():
        result = run_estimate(*base, *extra, "--json")
        assert result.returncode == 0, result.stderr
        found[name] = json.loads(result.stdout)
    gradients = found["ddp"]["held"]["gradients"] * 1e9  # every rank's whole copy
    buckets = max(1, round(gradients / BUCKET_BYTES))
    link = 300e9 * BUS_EFFICIENCY
    (ddp,) = {phase["link_seconds"] for phase in found["ddp"]["phases"]}
    assert ddp == pytest.approx(2 * 7 / 8 * gradients / link + buckets * COLLECTIVE_LATENCY_S)
    (two,) = {phase["link_seconds"] for phase in found["ddp_2_nodes"]["phases"]}
    network = 400 / 8 * 1e9 * BUS_EFFICIENCY / 8
    assert two == pytest.approx(ddp + 2 * 1 / 2 * gradients / 8 / network + buckets * COLLECTIVE_LATENCY_S)
    shard, passes = found["fsdp"]["held"], found["fsdp"]["passes"]
    (fsdp,) = {phase["link_seconds"] for phase in found["fsdp"]["phases"]}
    moved = passes * 7 / 8 * (2 * shard["weights"] / 2 + shard["gradients"]) * 8 * 1e9 / link
    collectives = (fsdp - moved) / COLLECTIVE_LATENCY_S  # three a unit a micro-batch
    assert passes == 2 and collectives == pytest.approx(round(collectives)) and round(collectives) % (3 * passes) == 0
    for phase in found["ddp"]["phases"]:  # hidden behind the backward, two thirds of the compute, but the last bucket
        last = 2 * 7 / 8 * min(gradients, BUCKET_BYTES) / link
        hidden = max(0.0, ddp - last - 2 / 3 * phase["gpu_seconds"])
        assert phase["exposed_link_seconds"] == pytest.approx(min(ddp, last + hidden))
    assert found["ddp_2_nodes"]["hours"] > found["ddp"]["hours"] / 2  # two nodes: faster, never twice
    unstated = run_estimate(*base, *runs["ddp_2_nodes"], "hardware.network_gbit_s=null")
    assert unstated.returncode == 2 and unstated.stderr.count("\n") == 1, unstated.stderr
    assert "'hardware': 8xa100_aws states no network_gbit_s" in unstated.stderr


def loader_config(*overrides: str):
    return validate(compose(["recipe=hot", "launcher.devices=8", "hardware=8xa100_aws", *overrides]), files=False)


def test_a_nodes_loaders_are_worth_the_threads_its_workers_find_free_at_its_cpus_speed():
    """8 ranks of one thread each leave 40 of a p4d's 48 cores; 8 workers a rank fill them and 24 of
    their second threads, each worth smt_yield of a core; -1 starts a rank's share of every thread."""
    from trainrun.estimate.datasheets import rates
    from trainrun.estimate.loader import loader_threads

    smt = rates().cpu.smt_yield
    assert rates().cpu.trainer_threads == 1
    eight = loader_threads(loader_config("data.num_workers=8"), 8)
    assert eight == pytest.approx((40 + smt * 24) * 0.77)
    assert loader_threads(loader_config("data.num_workers=4"), 8) == pytest.approx(32 * 0.77)  # cores enough
    every = loader_threads(loader_config("data.num_workers=-1"), 8)  # 12 a rank: 96, of which 88 are free
    assert every == pytest.approx((40 + smt * 48) * 0.77)
    faster = loader_config("data.num_workers=8", "hardware.cpu_speed=1.54")
    assert loader_threads(faster, 8) == pytest.approx(2 * eight)
    assert loader_threads(loader_config("hardware.cpu_speed=null"), 8) is None


def test_an_images_loader_cost_is_its_operations_at_the_side_and_randaugments_depth():
    """Each RandAugment operation adds its measured cost (Table 2 of the deep dive: depth 1 and 2
    each slower); the crop's side changes the cost; FFCV's is its stored JPEG and raw shares."""
    from trainrun.core.work import StepWork
    from trainrun.data.write import WriteSettings
    from trainrun.estimate.datasheets import rates
    from trainrun.estimate.loader import image_seconds

    ops, config = rates().image_ops, loader_config()
    plain = image_seconds(config, StepWork(176, 176))
    assert plain == pytest.approx(ops.decode_per_megapixel * ops.megapixels + ops.at("worker", 176))
    one, two = (image_seconds(config, StepWork(176, 176, image_ops=depth)) for depth in (1, 2))
    assert two - one == pytest.approx(one - plain) and one - plain == pytest.approx(ops.at("augment", 176))
    ffcv = validate(compose(["recipe=mild", "launcher.devices=8", "hardware=8xa100_aws"]), files=False)
    jpeg = WriteSettings().compress_probability
    expected = jpeg * ops.at("ffcv_jpeg", 128) + (1 - jpeg) * ops.at("ffcv_raw", 128)
    assert image_seconds(ffcv, StepWork(176, 128)) == pytest.approx(expected)  # FFCV decodes at the phase's side
    at_full = jpeg * ops.at("ffcv_jpeg", 176) + (1 - jpeg) * ops.at("ffcv_raw", 176)
    shrunk_on_device = StepWork(176, 128, loaded_resolution=176)  # progressive resizing as Composer's
    assert image_seconds(ffcv, shrunk_on_device) == pytest.approx(at_full)


def test_the_loader_costs_the_estimate_reads_are_the_bench_fit_of_its_readings():
    """readings.yaml's fitted costs are bench/loader_ops.py's fit of the readings beside them, and an
    operation's cost grows with its output's pixels."""
    import sys

    import yaml

    from trainrun.estimate.datasheets import TABLE, rates

    sys.path.insert(0, str(ROOT / "bench"))
    from loader_ops import fitted

    block = yaml.safe_load(TABLE.read_text())["image_ops"]
    assert fitted(block["readings"]) == block["fitted"]
    ops = rates().image_ops
    for operation, (fixed, per_megapixel) in block["fitted"].items():
        assert per_megapixel >= 0 and ops.at(operation, 200) == pytest.approx((fixed + per_megapixel * 0.04) / 1e3)


@pytest.mark.slow
def test_the_same_gpus_with_other_cpus_differ_where_the_loader_bounds_the_run():
    """The deep dive's Table 3: hot (RandAugment in Composer's 8 workers a GPU) is loader-bound and
    faster on the node with more and free cores; the estimate names the loader and says its node."""
    aws, oracle = (
        json.loads(
            run_estimate("recipe=hot", "data.num_workers=8", "launcher.devices=8", f"hardware={node}", "--json").stdout
        )
        for node in ("8xa100_aws", "8xa100_oracle")
    )
    assert aws["bottlenecks"][0] == "loader" and aws["hours"] > oracle["hours"]
    assert "8xa100_aws (48 cores, 96 threads at 0.77x a thread here, 8 training processes)" in aws["loader"]
    assert "1 augmentation op(s)" in aws["loader"]


def test_a_hardware_group_without_its_cpus_speed_is_one_line_naming_it():
    result = run_estimate("recipe=mild", "launcher.devices=8", "hardware=8xa100_aws", "hardware.cpu_speed=null")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cpu_speed" in result.stderr and "conf/hardware/8xh100_aws.yaml" in result.stderr


def test_the_operation_log_counts_a_products_flops_and_every_operations_bytes_read_and_written():
    """mm: 2 m k n FLOPs, its inputs read and its output written; an in-place add reads its operands
    and writes its target again; a view launches nothing."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainrun.estimate.operations import OperationLog

    with FakeTensorMode():
        a, b = torch.empty(64, 32), torch.empty(32, 16)
        with OperationLog() as log:
            product = a @ b
            product.t()
            product.add_(product)
    (mm_flops, mm_bytes, *_), (add_flops, add_bytes, *_) = log.operations
    assert (mm_flops, mm_bytes) == (2 * 64 * 32 * 16, 4 * (64 * 32 + 32 * 16 + 64 * 16))
    assert (add_flops, add_bytes) == (0, 4 * 3 * 64 * 16)


def test_a_normalizations_statistics_read_its_input_twice_where_they_span_more_than_a_row():
    """A batch norm in training reads its input once for its statistics and again to normalize, and
    its backward reads its inputs twice too; in evaluation (running statistics) and a layer norm's
    forward (a row at a time) read once; a layer norm's backward sums the weights' gradients over rows."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainrun.estimate.operations import OperationLog

    aten = torch.ops.aten
    with FakeTensorMode():
        x, channel = torch.empty(8, 16, 32, 32), torch.empty(16)
        rows, width = torch.empty(64, 256), torch.empty(256)
        with OperationLog() as log:
            _, mean, invstd = aten.native_batch_norm(x, channel, channel, channel, channel, True, 0.1, 1e-5)
            aten.native_batch_norm_backward(x, x, channel, channel, channel, mean, invstd, True, 1e-5, [True] * 3)
            aten.native_batch_norm(x, channel, channel, channel, channel, False, 0.1, 1e-5)
            _, row_mean, row_rstd = aten.native_layer_norm(rows, [256], width, width, 1e-5)
            aten.native_layer_norm_backward(rows, rows, [256], row_mean, row_rstd, width, width, [True] * 3)
    batch, batch_backward, evaluated, layer, layer_backward = (op.moved for op in log.operations)
    x_bytes, row_bytes = 4 * x.numel(), 4 * rows.numel()
    assert batch == pytest.approx(2 * x_bytes + x_bytes, rel=0.05)  # read twice, written once
    assert batch_backward == pytest.approx(2 * 2 * x_bytes + x_bytes, rel=0.05)  # two read twice, one written
    assert evaluated == pytest.approx(2 * x_bytes, rel=0.05)
    assert layer == pytest.approx(2 * row_bytes, rel=0.05)
    assert layer_backward == pytest.approx(2 * 2 * row_bytes + row_bytes, rel=0.05)


def test_a_gpus_autocast_runs_norms_and_softmax_in_float32_in_the_operations():
    """Under autocast a GPU computes a LayerNorm, a softmax and a sum in float32 (CUDA's autocast
    policy), where CPU autocast, which the fake pass runs under, keeps them in bfloat16: the
    operations are those of the GPU, casts included; without autocast nothing changes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainrun.estimate.autocast import AsGpuAutocast

    layer_norm = torch.nn.LayerNorm(64)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 64, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cpu_norm = layer_norm(x)
            with AsGpuAutocast():
                gpu_norm, gpu_softmax, gpu_sum = layer_norm(x), torch.softmax(x, -1), x.sum()
                gpu_product = torch.nn.functional.linear(gpu_norm, torch.empty(8, 64))
        with AsGpuAutocast():
            plain = torch.softmax(x, -1)
    assert cpu_norm.dtype == torch.bfloat16
    assert (gpu_norm.dtype, gpu_softmax.dtype, gpu_sum.dtype) == (torch.float32,) * 3
    assert gpu_product.dtype == torch.bfloat16  # the products stay in the lower precision
    assert plain.dtype == torch.bfloat16


def gpt_estimate(*overrides: str):
    from trainrun.estimate import estimate

    base = ["task=causal_lm", "model=gpt125", "data=stdlib_stream", "data.text.max_seq_len=1024"]
    base += ["train_batch_size=16", "precision=bf16", "launcher.devices=1", "hardware=8xh100_aws"]
    return estimate(validate(compose([*base, *overrides]), files=False), vocab=50304)


@pytest.mark.slow
def test_the_optimizers_step_is_its_operations_timed_one_by_one():
    """Fused AdamW is a few operations over the weights and their state; Muon's Newton-Schulz
    products (five quintic steps of 4 m^2 n + 2 m^3 FLOPs a matrix) and its per-matrix operations make
    its step slower than AdamW's by what they cost, and the estimate says so."""
    from trainrun.estimate import run_shape, sized_task
    from trainrun.estimate.memory import fake_world, measure

    adamw, muon = gpt_estimate("optimizer=adamw"), gpt_estimate("optimizer=muon")
    config = validate(compose(["task=causal_lm", "model=gpt125", "data=stdlib_stream", "optimizer=muon"]), files=False)
    with fake_world(1):
        operations = measure(config, run_shape(config, 50304), sized_task(config)).optimizer
    m, n, blocks = 768, 3072, 12  # each block: attention's 3 m x m and out m x m, the MLP's two m x n (wide)
    square, wide = 4 * m**3 + 2 * m**3, 4 * m * m * n + 2 * m**3
    assert sum(op.flops for op in operations) == pytest.approx(5 * blocks * (4 * square + 2 * wide), rel=0.05)
    assert len(operations) > 100 and muon.step_seconds > adamw.step_seconds
    (adamw_note,) = [note for note in adamw.notes if note.startswith("optimizer: ")]
    assert adamw_note.startswith("optimizer: 4 operations a step on each rank")  # fused, a group each


@pytest.mark.slow
def test_float8_computes_the_linear_layers_at_the_float8_peak_where_the_hardware_states_it():
    """fp8's linear layers' products at the float8 peak, said; where the group states no float8 peak
    they run at bf16's with the same casts, slower than both."""
    from trainrun.estimate.device import Device
    from trainrun.estimate.operations import FLOAT8, MATMUL, Operation

    product = Operation(2e12, 1.0, MATMUL, (1 << 20,) * 3)
    device = Device(1e15, 1000, hopper_like(), float8_flops=2e15)
    assert device.operation_seconds(product._replace(kind=FLOAT8)) == pytest.approx(
        device.operation_seconds(product) / 2
    )
    bf16, fp8 = gpt_estimate(), gpt_estimate("precision=fp8")
    assert any("at the float8 peak, 1978.9 TFLOP/s" in note for note in fp8.notes)
    unstated = gpt_estimate("precision=fp8", "hardware.peak_fp8_tflops=null")
    assert unstated.step_seconds > max(fp8.step_seconds, bf16.step_seconds)
    assert any("timed as bf16: hardware=8xh100_aws states no peak_fp8_tflops" in note for note in unstated.notes)


def hopper_like(**shares: float):
    """A generation whose products reach the whole peak at any shape, copies the whole bandwidth."""
    from trainrun.estimate.device import Generation

    values = dict(matmul=1.0, convolution_intensity=1e9, attention=1.0, memory=1.0, half_dimension=0.0, floor_s=1e-5,
                  policy_s=4e-5) | shares  # fmt: skip
    return Generation("test", **values, fitted_on=())


def test_an_operation_takes_the_slowest_of_its_flops_and_its_bytes_and_its_issue_hides_behind_the_queue():
    """2 TFLOP and 1 GB on a GPU of 1,000 TFLOP/s and 1,000 GB/s: 2 ms computing; 0 FLOPs and 3 GB: 3 ms
    moving; the two reach 2 of 5 ms' worth of the peak (and the first one's issue, 10 µs). At half
    the matmul share the product takes 4 ms; a product of 32 rows where a dimension of 32 halves its
    rate, 2 ms more than its FLOPs. A tiny operation costs its issue alone (the floor; selective
    checkpointing's policy on top), and a hundred of them behind the product cost nothing more."""
    from trainrun.estimate.device import Device
    from trainrun.estimate.operations import MATMUL, Operation

    device = Device(1e15, 1000, hopper_like())
    product, copy = Operation(2e12, 1e9, MATMUL, (1 << 20, 1 << 20, 1 << 20)), Operation(0.0, 3e9)
    assert device.utilisation([product, copy], 2e12) == pytest.approx(2 / 5.01, rel=1e-5)
    assert Device(1e15, 1000, hopper_like(matmul=0.5)).operation_seconds(product) == pytest.approx(4e-3, rel=1e-5)
    narrow = Operation(2e12, 1e9, MATMUL, (32, 1 << 30, 1 << 30))
    assert Device(1e15, 1000, hopper_like(half_dimension=32)).operation_seconds(narrow) == pytest.approx(4e-3, 1e-4)
    tiny = Operation(1.0, 1.0)
    assert device.seconds([tiny]) == pytest.approx(1e-5)  # the floor
    policy = Device(1e15, 1000, hopper_like(), checkpoint_policy=True)
    assert policy.seconds([tiny]) == pytest.approx(5e-5)  # selective checkpointing's policy
    assert device.seconds([product, *[tiny] * 100]) == pytest.approx(device.seconds([product]))
    assert device.seconds([*[tiny] * 100, product]) == pytest.approx(101e-5 + 2e-3)


def test_a_convolution_is_never_faster_than_its_kernels_traffic_nor_than_a_matrix_product():
    """2 TFLOP of convolution at 100 FLOPs a byte: on 1,000 TFLOP/s over 1,000 GB/s the traffic bounds
    it (20 ms, a tenth of the peak); on 10 TFLOP/s over the same memory the products' share does
    (200 ms): a GPU whose memory keeps up with its peak computes convolutions as matrix products."""
    from trainrun.estimate.device import Device
    from trainrun.estimate.operations import CONVOLUTION, MATMUL, Operation

    convolution = Operation(2e12, 1.0, CONVOLUTION, ())
    fast_compute = Device(1e15, 1000, hopper_like(convolution_intensity=100))
    assert fast_compute.operation_seconds(convolution) == pytest.approx(0.02)
    assert fast_compute.operation_seconds(convolution._replace(kind=MATMUL)) == pytest.approx(0.002)
    balanced = Device(1e13, 1000, hopper_like(convolution_intensity=100))
    assert balanced.operation_seconds(convolution) == pytest.approx(0.2)


def test_a_geforce_parts_products_are_fed_for_its_tensor_cores_full_rate_and_bounded_by_its_peak():
    """A part whose peak (FP32 accumulate, as torch computes) is half its tensor cores' full rate, an
    RTX 3090's 71 of 142 TFLOP/s, computes a large product at its peak where a part whose peak is its
    full rate reaches its share of it (here 60 %); a narrow product, fed at its share of the full
    rate less for its shape, twice as fast as there. Float32 runs without the full rate."""
    from trainrun.estimate.device import Device, device_of
    from trainrun.estimate.operations import MATMUL, Operation

    large, narrow = Operation(2e12, 1.0, MATMUL, (1 << 20,) * 3), Operation(2e12, 1.0, MATMUL, (32, 1 << 30, 1 << 30))
    shares = hopper_like(matmul=0.6, half_dimension=32)
    geforce, datacentre = Device(71e12, 1000, shares, full_rate_flops=142e12), Device(71e12, 1000, shares)
    assert geforce.operation_seconds(large) == pytest.approx(2e12 / 71e12, rel=1e-5)
    assert datacentre.operation_seconds(large) == pytest.approx(2e12 / (0.6 * 71e12), rel=1e-3)
    assert datacentre.operation_seconds(narrow) == pytest.approx(2 * geforce.operation_seconds(narrow), rel=1e-5)
    rtx3090 = ["model=resnet_small", "data=synthetic", "hardware=1xrtx3090"]
    assert device_of(validate(compose([*rtx3090, "precision=amp"]), files=False)).full_rate_flops == 142e12
    assert device_of(validate(compose([*rtx3090, "precision=fp32"]), files=False)).full_rate_flops is None


def test_a_grouped_convolutions_backward_counts_its_forwards_flops_for_each_gradient():
    """torch's formula counts a grouped convolution's weight gradient as if it had one group (a
    depthwise 3 x 3 over 64 channels: 65 forwards); the estimate's, two forwards, one without the
    input's gradient, and a transposed convolution's the same way."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from trainrun.estimate.flops import flop_formulas

    for layer in (torch.nn.Conv2d, torch.nn.ConvTranspose2d):
        for groups in (1, 8, 64):
            convolution = layer(64, 64, 3, stride=2, padding=1, groups=groups, bias=False)
            for needs_grad, gradients in ((True, 2), (False, 1)):
                x = torch.randn(2, 64, 16, 16, requires_grad=needs_grad)
                with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as forward:
                    y = convolution(x)
                with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as backward:
                    y.sum().backward()
                assert backward.get_total_flops() == gradients * forward.get_total_flops(), (layer, groups)


@pytest.mark.parametrize("groups", [1, 16])
def test_a_convolutions_backward_is_a_kernel_for_each_gradient_each_reading_the_outputs_gradient(groups):
    """As cuDNN runs it: the input's gradient (reading the output's gradient and the weight), the
    weight's (reading it and the input), the bias's (a reduction of it); without the input's gradient,
    no kernel for it. The two products hold the backward's FLOPs, a forward's each."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainrun.estimate.operations import MEMORY, OperationLog

    with FakeTensorMode():
        convolution = torch.nn.Conv2d(16, 32, 3, padding=1, groups=groups)
        for needs_grad in (True, False):
            x = torch.randn(2, 16, 8, 8, requires_grad=needs_grad)
            y = convolution(x)
            log = OperationLog()
            with log:
                y.backward(torch.ones_like(y))
            forward = 2 * y.numel() * convolution.weight[0].numel()
            gradient, weight, bias = 4 * y.numel(), 4 * convolution.weight.numel(), 4 * 32
            products = [(op.flops, op.moved) for op in log.operations if op.flops]
            each = (forward, gradient + weight + 4 * x.numel())  # the input's: its gradient's; the weight's: it
            assert products == [each] * (2 if needs_grad else 1)
            assert (0.0, gradient + bias) in [(op.flops, op.moved) for op in log.operations if op.kind == MEMORY]
            convolution.zero_grad(set_to_none=True)


def test_a_compiled_step_is_timed_as_inductors_kernels_each_element_wise_chain_one():
    """Compiled, the element-wise operations between two matrix products inside a compiled region are
    one kernel that reads what it takes from outside once (B: 1 GB, read twice) and writes what
    outlives it (E: 2 GB, which the next product reads), its intermediates (C, D) kept on chip: 3 ms
    where eager takes 16 ms; one that makes a tensor nobody reads (a gradient) writes it; each product
    stays its own kernel, an operation outside the compiled regions (a head's) too, one logged
    without its tensors moves what it moved alone, and a chain pays the floor an operation costs once."""
    from trainrun.estimate.device import Device, fused_kernels
    from trainrun.estimate.operations import MATMUL, Access, Operation

    def tensor(storage: int, gb: float) -> Access:
        return Access(storage, (), int(gb * 1e9))

    a, b, c, d, e, f, g = (tensor(storage, gb) for storage, gb in enumerate((1, 1, 3, 3, 2, 1, 1), start=1))

    def operation(reads: tuple[Access, ...], made: Access, **kind) -> Operation:
        moved = sum(access.bytes for access in (*reads, made))
        flops = kind.pop("flops", 0.0)
        return Operation(flops, moved, compiled=True, reads=reads, writes=(made,), made=(made.storage,), **kind)

    product = {"flops": 2e12, "kind": MATMUL, "dims": (1 << 20,) * 3}
    first, second = operation((a,), b, **product), operation((e,), f, **product)
    chain = [operation((b,), c), operation((c,), d), operation((d, b), e)]  # 4, 6 and 6 GB alone
    gradient = operation((f,), g)  # nobody reads g
    operations = [first, *chain, second, gradient]
    assert fused_kernels(operations) == [first, Operation(0.0, 3e9), second, Operation(0.0, 2e9)]
    outside = [first, chain[0]._replace(compiled=False), *chain[1:]]
    assert fused_kernels(outside)[1:] == [
        chain[0]._replace(compiled=False),
        Operation(0.0, 6e9),
    ]  # reads c, b; writes e
    alone = Operation(0.0, 5e9, compiled=True)  # logged without its tensors
    assert fused_kernels([*chain, alone]) == [Operation(0.0, 1e9 + 2e9 + 5e9)]  # e never read: written
    eager, compiled = Device(1e15, 1000, hopper_like()), Device(1e15, 1000, hopper_like(), compiled=True)
    assert eager.utilisation(operations, 4e12) == pytest.approx(4 / 23.01, rel=1e-4)  # 2 + 4 + 6 + 6 + 3 + 2 ms
    assert compiled.utilisation(operations, 4e12) == pytest.approx(4 / 10.01, rel=1e-4)  # 2 + 3 + 3 + 2 ms
    tiny = [Operation(0.0, 1.0, compiled=True)] * 10
    small = Operation(1e6, 1.0, MATMUL, (1 << 20,) * 3)
    assert fused_kernels(tiny) == [Operation(0.0, 10.0)]
    assert eager.utilisation([small, *tiny], 1e6) == pytest.approx(1e6 / 1e15 / (11 * 1e-5), rel=1e-4)
    assert compiled.utilisation([small, *tiny], 1e6) == pytest.approx(1e6 / 1e15 / (2 * 1e-5), rel=1e-4)


def inductor_bytes(step: Callable[[], None]) -> int:
    """The bytes inductor counts its kernels reading and writing (its graphs' ``count_bytes``: the
    fused kernels' and the products') in ``step``, which compiles what it runs; compiled afresh."""
    import logging

    import torch
    from torch._inductor import metrics

    torch._dynamo.reset()
    torch._logging.set_logs(inductor_metrics=True)  # inductor counts its graphs' bytes only when it logs them
    logging.getLogger("torch._inductor.compile_fx").setLevel(logging.WARNING)
    try:
        metrics.reset()
        with torch._inductor.config.patch(fx_graph_cache=False):  # compiled here, not read from a cache
            step()
        return metrics.num_bytes_accessed
    finally:
        torch._logging.set_logs()


def fused_region_bytes(log: Any) -> tuple[float, float]:
    """The bytes the compiled regions of ``log``'s operations move as the estimate's fused kernels, and eager."""
    from trainrun.estimate.device import fused_kernels

    kernels = [kernel for kernel in fused_kernels(log.operations) if kernel.compiled or not kernel.reads]
    return sum(kernel.moved for kernel in kernels), sum(op.moved for op in log.operations if op.compiled)


def test_a_depthwise_convolution_is_its_own_kernel_compiled_and_timed_at_the_memorys_bandwidth():
    """Inductor calls cuDNN for every convolution: a compiled region's depthwise convolution is not
    fused with the element-wise operations around it, and it is timed by its bytes alone (its FLOPs
    at no share of the peak); a grouped one as a convolution."""
    from trainrun.estimate.device import Device, fused_kernels
    from trainrun.estimate.operations import CONVOLUTION, DEPTHWISE, GROUPED, MEMORY, Operation

    around, depthwise = Operation(0.0, 1e9, compiled=True), Operation(1e12, 2e9, DEPTHWISE, compiled=True)
    kernels = fused_kernels([around, around, depthwise, around])
    assert [(kernel.kind, kernel.moved) for kernel in kernels] == [(MEMORY, 2e9), (DEPTHWISE, 2e9), (MEMORY, 1e9)]
    device = Device(1e15, 1000, hopper_like())
    assert device.operation_seconds(depthwise) == pytest.approx(2 / (1000 * hopper_like().memory))
    grouped = Operation(1e12, 1.0, GROUPED, (1 << 20,) * 3)
    assert device.operation_seconds(grouped) == device.operation_seconds(grouped._replace(kind=CONVOLUTION))


def test_an_estimate_says_what_depthwise_and_grouped_convolutions_leave_out_with_what_the_validation_shows(
    monkeypatch,
):
    """A step whose depthwise and grouped convolutions take 5 % of its time or more says their share
    and the published-over-estimated steps the validation's counted rows with them showed; an
    EfficientNet on an RTX 3090 does, a ResNet-50 (no such convolution) does not."""
    from trainrun.estimate import device

    monkeypatch.setattr(device, "validation_table", lambda: {"several_groups": {"a": 1.06, "b": 2.19}})
    assert device.several_groups_notes(0.049) == []
    (note,) = device.several_groups_notes(0.09)
    assert note.startswith(device.SEVERAL_GROUPS_NOTE + ": 9% of the step's GPU time")
    assert note.endswith("took 1.06-2.19 times the estimate (2 rows)")
    from trainrun.estimate import estimate

    timm = ["model=timm", "data=synthetic", "data.resolution=64", "precision=amp", "hardware=1xrtx3090"]
    timm += ["launcher.devices=1", "train_batch_size=8"]
    efficientnet = estimate(validate(compose([*timm, "model.arch=efficientnet_b0"]), files=False))
    resnet = estimate(validate(compose([*timm, "model.arch=resnet18"]), files=False))
    assert any(note.startswith(device.SEVERAL_GROUPS_NOTE) for note in efficientnet.notes)
    assert not any(note.startswith(device.SEVERAL_GROUPS_NOTE) for note in resnet.notes)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["nanogpt", "speedrun"])
def test_a_compiled_blocks_traffic_is_within_15_percent_of_what_inductor_counts(block):
    """A GPT block's training pass compiled by inductor on this CPU: the bytes its kernels move by
    inductor's own count against the estimate's fused kernels of the same pass (nanoGPT's block:
    450 MB against 463; the speedrun's: 509 against 565), and eager more (505 and 1,238 MB)."""
    import torch

    from trainrun.estimate.operations import InsideRegions, OperationLog
    from trainrun.models.gpt import GPT, Attend
    from trainrun.schema import GPTConfig

    switches = {"speedrun": dict(positions="rotary", norm="rmsnorm", qk_norm=True, mlp="relu2")}.get(block, {})
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(layers=1, heads=4, width=256, max_seq_len=512, **switches), vocab_size=1000)
    rotary = (gpt.rotary_cos, gpt.rotary_sin) if switches else None
    x = torch.randn(8, 512, 256, requires_grad=True)

    def step(module: torch.nn.Module) -> None:
        (module(x, rotary, Attend(None)).float().square().mean() / 2).backward()

    with OperationLog(InsideRegions([gpt.blocks[0]])) as log:
        step(gpt.blocks[0])
    (estimated, eager), counted = fused_region_bytes(log), inductor_bytes(lambda: step(torch.compile(gpt.blocks[0])))
    print(block, f"inductor {counted / 1e6:.0f} MB, estimate {estimated / 1e6:.0f} MB, eager {eager / 1e6:.0f} MB")
    assert abs(estimated / counted - 1) < 0.15 and eager > estimated


@pytest.mark.slow
def test_a_compiled_logits_tail_and_loss_move_what_inductor_counts():
    """GPT's soft-capped logits over a padded vocabulary and the next-token loss, each compiled as a
    blocks-compiled run compiles them (the head's product eager), at a size where the eager loss goes
    chunk by chunk: the estimate's fused kernels (the chunked loss's, as the eager pass records
    them) move within 15 % of what inductor counts for the plain loss it compiles (1,181 MB against
    1,182: nine times the logits' 131 MB), where eager moves 4,459 MB."""
    import torch

    from trainrun.estimate.operations import InsideRegions, OperationLog
    from trainrun.models.gpt import LogitTail
    from trainrun.tasks.causal_lm import next_token_cross_entropy

    torch.manual_seed(0)
    head, tail = torch.nn.Linear(64, 4032, bias=False).to(torch.bfloat16), LogitTail(4000, 15.0)
    x, targets = torch.randn(16, 1024, 64, dtype=torch.bfloat16, requires_grad=True), torch.randint(0, 4000, (16, 1024))

    def step(logits: Callable, loss: Callable) -> None:
        (loss(logits(head(x)), targets) / 2).backward()

    regions = InsideRegions([tail])
    with OperationLog(regions) as log:
        step(tail, regions.around(next_token_cross_entropy))
    (estimated, eager), counted = (
        fused_region_bytes(log),
        inductor_bytes(lambda: step(torch.compile(tail), torch.compile(next_token_cross_entropy))),
    )
    print(f"inductor {counted / 1e6:.0f} MB, estimate {estimated / 1e6:.0f} MB, eager {eager / 1e6:.0f} MB")
    assert abs(estimated / counted - 1) < 0.15 and eager > 3 * estimated


def test_the_operation_log_tells_products_convolutions_and_attention_by_their_gemm():
    """A linear layer's product is (rows, outputs, inputs); a grouped convolution's implicit GEMM is a
    group's, named grouped; a depthwise convolution is named so (timed memory-bound); attention is
    (queries, keys, head width) and reaches the log as one fused kernel even with a mask and dropout
    (as a GPU runs it)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainrun.estimate.operations import (
        ATTENTION,
        DEPTHWISE,
        GROUPED,
        MATMUL,
        MEMORY,
        AsFusedAttention,
        OperationLog,
    )

    with FakeTensorMode():
        x, linear = torch.randn(8, 16, 64), torch.nn.Linear(64, 256)
        grouped, depthwise = torch.nn.Conv2d(32, 64, 3, groups=4), torch.nn.Conv2d(32, 32, 3, groups=32)
        images, q = torch.randn(2, 32, 10, 10), torch.randn(2, 4, 128, 32)
        mask = torch.ones(128, 128, dtype=torch.bool)
        log = OperationLog()
        with AsFusedAttention(), log:
            linear(x)
            grouped(images)
            depthwise(images)
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask, dropout_p=0.1)
    kinds = [(op.kind, op.dims) for op in log.operations if op.flops or op.kind != MEMORY]
    assert (MATMUL, (128, 256, 64)) in kinds and (GROUPED, (2 * 8 * 8, 16, 8 * 9)) in kinds
    assert (ATTENTION, (128, 128, 32)) in kinds and (DEPTHWISE, ()) in kinds


def test_the_operation_log_counts_the_flop_counters_products_and_the_attention_kernels_work():
    """A training pass as its operations holds the products' FLOPs ``pass_flops`` counts, and a
    causal attention kernel's work: half the model's FLOPs (the blocks past the diagonal skipped),
    its backward five products to the forward's two (the scores recomputed)."""
    from trainrun.estimate import run_shape, sized_task
    from trainrun.estimate.memory import pass_flops, pass_operations
    from trainrun.estimate.operations import ATTENTION

    overrides = ["task=causal_lm", "model=gpt_tiny", "data=stdlib_stream", "data.text.max_seq_len=64"]
    config = validate(compose([*overrides, "train_batch_size=4", "precision=bf16"]), files=False)
    task, text = sized_task(config), run_shape(config, 512).text
    operations = pass_operations(config, task, text, 2)
    attention = [op.flops for op in operations if op.kind == ATTENTION]
    forwards, backwards = attention[: len(attention) // 2], attention[len(attention) // 2 :]
    assert backwards == [2.5 * flops for flops in reversed(forwards)]  # the kernel's five products to two
    products = sum(op.flops for op in operations if op.kind != ATTENTION)
    model_attention = 3 * 2 * sum(forwards)  # causal: the kernel does half the model's attention FLOPs
    assert products + model_attention == pytest.approx(pass_flops(config, task, text, 2))


def mild_on_one_gpu(*overrides: str):
    from trainrun.estimate import estimate

    base = ["recipe=mild", "data.resolution=176", "train_batch_size=256", "launcher.devices=1", "hardware=8xh100_aws"]
    return estimate(validate(compose([*base, *overrides]), files=False))


@pytest.mark.slow
def test_a_steps_utilisation_is_its_operations_on_the_datasheet():
    """recipe=mild on one H100 at 176 px is timed near its reading (6,237 img/s, a fit reading); at
    96 px its operations reach less of the peak (more of them at the floor an operation costs); on an
    H200 (the H100's compute, more bandwidth) its memory-bound operations run faster. The estimate
    says how its GPU was timed."""
    own, small, h200 = mild_on_one_gpu(), mild_on_one_gpu("data.resolution=96"), mild_on_one_gpu("hardware=8xh200")
    assert 256 / own.step_seconds == pytest.approx(6237, rel=0.15)
    assert small.mfu < 0.97 * own.mfu and h200.step_seconds < own.step_seconds
    assert own.rate_basis == "measured (h100 readings in the hopper fit)"
    assert h200.rate_basis == "measured (h200 readings in the hopper fit)"


def test_an_evaluation_is_timed_from_its_forwards_operations_at_its_micro_batch():
    """An evaluation's forward passes reach the share of the peak their own operations do (no backward,
    no optimizer, at the evaluation's resolution and micro-batch), not the training step's; where the
    share is stated (--mfu), the stated one."""
    from trainrun.estimate import estimate, run_shape, sized_task
    from trainrun.estimate.counts import FlopCounts
    from trainrun.estimate.device import device_of

    overrides = ["model=resnet18", "data=synthetic", "data.resolution=128", "data.eval_resolution=224"]
    overrides += ["data.samples=[10000,1000]", "train_batch_size=128", "eval_batch_size=16", "precision=amp"]
    config = validate(compose([*overrides, "launcher.devices=1", "hardware=8xh100_aws"]), files=False)
    result, shape = estimate(config), run_shape(config, None)
    counts = FlopCounts(config, sized_task(config), None, 2, shape.micro_batch, "none", shape.eval_micro_batch)
    share = counts.utilisation_at(224, None, device_of(config), train=False)
    assert shape.eval_micro_batch == 16 and share != pytest.approx(result.mfu, rel=0.05)
    assert result.eval_flops == pytest.approx(1000 * counts.counted_at(224, None, train=False))
    assert result.eval_gpu_seconds == pytest.approx(result.eval_flops / (result.peak_tflops * 1e12 * share))
    stated = estimate(config, mfu=0.3)
    assert stated.eval_gpu_seconds == pytest.approx(result.eval_flops / (result.peak_tflops * 1e12 * 0.3))


@pytest.mark.parametrize("options", ["8xa100_aws,,8xh100_aws", "8xa100_aws,", ","])
def test_compare_refuses_an_empty_option_in_one_line(options, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal of the flag's value: its usage and one line
        main(["estimate", "recipe=mild", "--compare", options])
    refusal = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and refusal.startswith("trainrun estimate: error: argument --compare:")
    assert "empty option" in refusal or "names no conf/hardware option" in refusal


@pytest.mark.parametrize("order", ["after", "before"])
def test_estimate_takes_hydras_config_location_flags_in_either_order(order, tmp_path):
    """``trainrun estimate -cd myconf hardware=mygpu`` and ``trainrun -cd myconf estimate ...``: a hardware
    group of the user's own, estimated as the shipped group it copies."""
    group = tmp_path / "myconf" / "hardware" / "mygpu.yaml"
    group.parent.mkdir(parents=True)
    shipped = (Path(__file__).resolve().parents[1] / "conf" / "hardware" / "8xh100_aws.yaml").read_text()
    group.write_text(shipped.replace("name: 8xh100_aws", "name: mygpu"))
    run = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "train_batch_size=8", "max_duration=10ba"]
    flags = ["-cd", "myconf"]
    argv = (
        ["estimate", *flags, *run, "hardware=mygpu"]
        if order == "after"
        else [*flags, "estimate", *run, "hardware=mygpu"]
    )
    own = run_here(*argv, "--json", cwd=tmp_path)
    assert own.returncode == 0, own.stderr
    shipped_estimate = run_estimate(*run, "hardware=8xh100_aws", "--json")
    assert json.loads(own.stdout)["hours"] == pytest.approx(json.loads(shipped_estimate.stdout)["hours"])


def test_a_group_of_the_users_own_with_a_value_its_field_refuses_is_one_line_naming_the_key(tmp_path):
    """A value the schema refuses in a group file of the user's own (``-cd myconf``) is named by its
    key and value, as on the command line, not by Hydra's first line ("ValidationError raised")."""
    group = tmp_path / "myconf" / "hardware" / "mygpu.yaml"
    group.parent.mkdir(parents=True)
    group.write_text("name: mygpu\ngpu: mygpu\npeak_tflops: fast\nmemory_gb_s: 900\n")
    refused = run_here(
        "estimate", "-cd", "myconf", "model=resnet_small", "data=synthetic", "hardware=mygpu", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "'hardware.peak_tflops'" in refused.stderr and "'fast'" in refused.stderr


def test_a_multi_node_ddp_step_is_the_gpus_time_and_its_unhidden_exchange_once():
    """Two nodes of 8 H100s, a model small enough for its gradients' all-reduce across nodes to outlast
    the backward: the step pays the part of the exchange the backward does not hide, once."""
    run = ["task=causal_lm", "data=stdlib_stream", "model=llama_tiny", "train_batch_size=64", "max_duration=100ba"]
    result = run_estimate(*run, "launcher.devices=8", "launcher.nnodes=2", "hardware=8xh100_aws", "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    (phase,) = estimate["phases"]
    assert 0 < phase["exposed_link_seconds"] <= phase["link_seconds"]
    assert phase["seconds"] == pytest.approx(phase["gpu_seconds"] + phase["exposed_link_seconds"], rel=1e-9)
    assert estimate["step_seconds"] == pytest.approx(phase["seconds"], rel=1e-9)


@pytest.mark.parametrize("limit", [500.0, 120.0, 75.0, 20.0, 5.0])
def test_the_search_for_a_fitting_micro_batch_starts_where_the_memory_predicts_and_finds_what_halving_finds(
    monkeypatch, limit
):
    """What a rank holds stays and the rest shrinks with the micro-batch: from the whole batch's pass
    the search measures the halving predicted to fit, and its neighbours, not every halving; its
    answer is the first of the halvings (then stronger checkpointing) that fits, as one by one."""
    import trainrun.estimate as estimate_module
    from trainrun.estimate import RunShape, first_fitting, fitting_shapes
    from trainrun.estimate.memory import Memory

    def memory(shape: RunShape) -> Memory:
        relief = {"none": 1.0, "selective": 0.5, "full": 0.2}[shape.checkpointing]
        peak = 12.0 + 1.3 * 45.0 * shape.micro_batch**0.97 * relief  # held 12 GB, the rest nearly linear
        return Memory(held={"weights": 4.0, "gradients": 4.0, "optimizer": 4.0}, peak={"total": peak}, eval_peak=1.0)

    measured = []
    monkeypatch.setattr(estimate_module, "measure", lambda config, shape, task: measured.append(shape) or memory(shape))
    whole = RunShape(8, 1, 32, 32, 32, None, "", "none")
    found, _ = first_fitting(None, whole, None, limit, memory(whole))
    expected = next((shape for shape in fitting_shapes(whole) if memory(shape).highest <= limit), None)
    assert found == expected
    if expected is not None and expected.checkpointing == "none":
        assert len(measured) <= 3  # of six halvings


def test_a_blocks_compiled_models_head_runs_eager_its_tail_and_loss_compiled_and_float8_products_in_float8():
    """Under ``InsideRegions`` of the modules ``compile_model`` compiles (a model's blocks and its
    logits' tail) and around the loss ``compile_loss`` compiles, a block's operations are marked
    compiled in the forward and the backward, the head's product and its gradients are not, the
    tail's and the loss's are, forward and backward; under precision=fp8's regions, a float8 layer's
    products are float8 (half the bytes), each with its operands' casts beside it, and the head's
    product stays bf16's."""
    import torch

    from trainrun.core.compiled import compiled_regions, compiles_loss
    from trainrun.core.precision import float8_eligible
    from trainrun.estimate.operations import FLOAT8, FLOAT8_CAST_BYTES, MATMUL, InsideRegions, OperationLog
    from trainrun.tasks.causal_lm import CausalLanguageModeling

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(2)
            )
            self.head, self.logit_tail = torch.nn.Linear(32, 48, bias=False), torch.nn.Tanh()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.logit_tail(self.head(x))

    model, x = Blocks(), torch.randn(16, 32, requires_grad=True)
    eligible = [module for name, module in model.named_modules() if float8_eligible(module, name)]
    regions = InsideRegions(compiled_regions(model))
    assert compiles_loss(model, CausalLanguageModeling())
    loss = regions.around(lambda logits: logits.softmax(-1).sum())
    with OperationLog(regions, InsideRegions(eligible)) as log:
        (loss(model(x)) / 2).backward()  # scaled, as a step's loss (a root's gradient hooks do not run)
    operations = log.operations
    head = [index for index, op in enumerate(operations) if op.kind == MATMUL]  # its forward, its two gradients
    assert len(head) == 3 and head[1] + 1 == head[2]
    assert all(op.compiled for op in operations[: head[0]])  # the blocks' forward
    assert not any(operations[index].compiled for index in head)
    # the tail and the loss, the scaling outside them (forward, gradient seed, backward), their backward
    assert [op.compiled for op in operations[head[0] + 1 : head[1]]] == [True] * 3 + [False] * 3 + [True] * 2
    assert all(op.compiled for op in operations[head[2] + 1 :])  # the blocks' backward
    float8 = [op for op in operations if op.kind == FLOAT8]
    assert len(float8) == 2 * 3  # two layers' three products each
    cast = operations[operations.index(float8[0]) - 1]
    assert cast.moved == FLOAT8_CAST_BYTES * (16 * 32 + 32 * 32) and cast.kind == "memory"


def test_a_linear_layer_over_sequences_is_one_product_its_outputs_reshape_launches_nothing():
    """torch's matmul of a (batch, length, width) input takes the product of its rows and reshapes
    the output with ``_unsafe_view``, a view its schema does not mark as one: no kernel, no bytes."""
    import torch

    from trainrun.estimate.operations import MATMUL, OperationLog

    layer, x = torch.nn.Linear(16, 32, bias=False), torch.randn(4, 8, 16)
    with OperationLog() as log:
        layer(x)
    assert [op.kind for op in log.operations] == [MATMUL]
    assert log.operations[0].moved == 4 * (4 * 8 * 16 + 32 * 16 + 4 * 8 * 32)


def test_a_gather_or_a_scatter_moves_the_rows_it_picks_not_the_whole_table():
    """An embedding of 4 rows from a table of 10,000 reads those rows (and writes them), not the
    table; an in-place indexed write moves its values, not the whole tensor it writes into."""
    import torch

    from trainrun.estimate.operations import OperationLog

    table, indices = torch.randn(10_000, 64), torch.tensor([1, 2, 3, 4])
    with OperationLog() as log:
        torch.nn.functional.embedding(indices, table)
        table[indices] = torch.zeros(4, 64)
    embedding, *_, scatter = log.operations
    assert embedding.moved == indices.numel() * 8 + 2 * 4 * 64 * 4
    assert scatter.moved == 2 * (indices.numel() * 8 + 4 * 64 * 4)
