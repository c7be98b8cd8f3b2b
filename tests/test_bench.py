"""The benchmarks run (tiny sizes on this CPU), and compile=true trains like eager mode."""

import json
import math
import pickle
import re
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import TINY, captured_output, read_metrics, run_cli

from trainrun.report.explorer import published_runs

ROOT = Path(__file__).resolve().parent.parent


# benches whose ranks (or measured processes) are spawned and import the bench's own functions, which
# run_path's __main__ cannot give
IN_THEIR_PROCESS = {"sharding.py", "logits.py", "block_mask.py"}


def bench(script: str, *args: str) -> subprocess.CompletedProcess:
    """``python bench/SCRIPT ARGS``, its exit code and output captured: in this process (the suite has
    imported torch and trainrun already), or in its own for the scripts in :data:`IN_THEIR_PROCESS`
    and for ``--compile`` (inductor's compile workers and caches stay out of the test's process).
    An exception a bench raises here fails the test with its traceback."""
    path = ROOT / "bench" / script
    if script in IN_THEIR_PROCESS or "--compile" in args:
        return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=600)
    code, threads = 0, torch.get_num_threads()
    here = mock.patch.object(sys, "path", [str(path.parent), *sys.path])  # its sibling modules importable
    with mock.patch.object(sys, "argv", [str(path), *args]), here:
        with captured_output() as (out, err):
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exit_:  # as the interpreter ends: a message is printed, with exit code 1
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
            finally:
                torch.set_num_threads(threads)  # a loader bench keeps its main process to one thread
    return subprocess.CompletedProcess([str(path), *args], code, out.getvalue(), err.getvalue())


@pytest.mark.slow
def test_gpu_throughput_runs_tiny_on_cpu():
    result = bench("gpu_throughput.py", "--tiny")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "model step" in line]
    assert len(lines) == 4 and all("mild full step" in line for line in lines)  # fp32/bf16 x NCHW/NHWC


@pytest.mark.slow
def test_algorithm_bench_measures_every_method():
    result = bench("algorithms.py", "--model", "resnet_small", "--resolution", "16", "--steps", "2", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "ms / step" not in line]
    rows = [row for row in rows if not row.startswith("| ---")]
    assert len(rows) == 1 + 19  # none + every image method


@pytest.mark.slow
def test_compile_trains_like_eager(tmp_path):
    args = [*TINY, "max_duration=6ba", "eval_interval=6ba"]
    eager = run_cli(*args, f"hydra.run.dir={tmp_path / 'eager'}")
    compiled = run_cli(*args, "compile=true", f"hydra.run.dir={tmp_path / 'compiled'}", timeout=600)
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr
    (a,), (b,) = read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "compiled")
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
    assert b["top1"] == pytest.approx(a["top1"], abs=0.01)


@pytest.mark.slow
def test_hot_loader_bench_prints_every_folder_path_and_its_rate_per_worker(tmp_path):
    args = ["--hot", "--images", "24", "--batch", "8", "--rounds", "1", "--workers", "1", "--dir", str(tmp_path)]
    result = bench("loaders.py", *args, "--resolution", "32", "--sides", "64", "96")
    assert result.returncode == 0, result.stderr
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| trainrun")]
    names = [
        f"trainrun folder, decode={decode}{extra}" for decode in ("full", "draft") for extra in ("", " + RandAugment")
    ]
    assert [row[0] for row in rows] == names  # nvJPEG rows only on a GPU
    for _name, rate, spread, per_worker in rows:
        low, high = (float(value) for value in spread.split("-"))
        assert 0 < low <= float(rate) <= high and float(per_worker) == pytest.approx(float(rate), abs=1)


def test_loader_operations_bench_prints_each_operation_at_each_side_and_their_fit():
    """bench/loader_ops.py on a few photographs: readings.yaml's image_ops block, each operation read at
    each side and fitted (the test of readings.yaml's block is in tests/test_estimate.py)."""
    import yaml

    result = bench("loader_ops.py", "--images", "16", "--sides", "64", "96", "--epoch", "64")
    assert result.returncode == 0, result.stderr
    block = yaml.safe_load(result.stdout[result.stdout.index("image_ops:") :])["image_ops"]
    assert set(block["readings"]) == {64, 96} and block["mean_kb"] > 20 and block["decode_ms_per_mp"] > 0
    operations = {"worker", "augment", "draft", "ffcv_jpeg", "ffcv_raw"}
    assert set(block["fitted"]) == operations and all(set(row) == operations for row in block["readings"].values())
    for row in block["readings"].values():  # their order is the bench's reading, not a test's: 16 images are noise
        assert row["ffcv_jpeg"] > 0 and row["ffcv_raw"] > 0 and row["draft"] > 0


@pytest.mark.slow
def test_loader_bench_compares_every_loader(tmp_path):
    args = ["--images", "40", "--batch", "8", "--rounds", "1", "--storage", "proportion:64:0.5", "--dir", str(tmp_path)]
    result = bench("loaders.py", *args)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ") and "img/s" not in line]
    rows = [[cell.strip() for cell in line.strip("| ").split(" | ")] for line in lines[1:]]
    assert [row[0] for row in rows] == ["torchvision ImageFolder + DataLoader", "FFCV as published", "trainrun FFCV"]
    torchvision = float(rows[0][2])
    for name, _storage, rate, spread, ratio, _first in rows:
        low, high = (float(value) for value in spread.split("-"))
        assert 0 < low <= float(rate) <= high, name  # the median epoch lies within the measured range
        shown = float(ratio.split("x")[0])
        rounding = 0.005 + 0.5 * (1 + shown) / torchvision  # ratio to 2 decimals, rates to whole img/s
        assert shown == pytest.approx(float(rate) / torchvision, abs=rounding), name
    assert rows[0][4] == "1.00x" and rows[2][4].endswith("(target >= 3x)")
    assert (tmp_path / "images-40-proportion-64-0.5.beton").is_file()  # kept with --dir, reused next time


@pytest.mark.slow
@pytest.mark.parametrize(("lengths", "compiled"), [("uniform", False), ("corpus", True)])
def test_bert_bench_compares_padded_and_unpadded_steps(lengths, compiled):
    args = ["--batch", "8", "--seq", "32", "--steps", "2", "--rounds", "1", "--lengths", lengths]
    names = ["padded", "padded + masked head", "unpadded", "unpadded + masked head", "padded + fused layers"]
    names += ["unpadded + masked head + fused layers"]
    if compiled:  # the unpadded compiled row beside padded, the reference (the eager ones are the other case's)
        names = ["padded", "unpadded + masked head + compile"]
        args += ["--compile", "--variants", *names[1:]]
    result = bench("bert.py", *args)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")][2:]
    rows = {line.strip("| ").split(" | ")[0]: line.strip("| ").split(" | ")[1:] for line in lines}
    assert list(rows) == names
    assert f"real tokens ({lengths} lengths)" in result.stdout.splitlines()[0]
    padded = float(rows["padded"][0])
    flops = {}  # per sequence, from the FLOP/s (3 significant digits) and sequences/s (to 0.1) shown
    for name, (best, rounds, ratio, _tokens, tflops, mfu) in rows.items():
        assert float(best) == max(float(value) for value in rounds.split(", ")) > 0  # the best round
        rounding = 0.005 + float(best) / padded * (0.05 / float(best) + 0.05 / padded)  # rates shown to 0.1
        assert float(ratio.rstrip("x")) == pytest.approx(float(best) / padded, abs=rounding)
        last_digit = 10 ** (math.floor(math.log10(float(tflops))) - 2)
        flops[name] = (float(tflops) * 1e12 / float(best), 0.5 * last_digit / float(tflops) + 0.05 / float(best))
        assert mfu == "–"  # no peak known for a CPU
    # model FLOPs: what the real tokens need, the same for every variant (so MFU compares variants), to
    # the rounding of the two figures each is read from
    padded_flops, padded_error = flops["padded"]
    for name, (value, error) in flops.items():
        assert value == pytest.approx(padded_flops, rel=1.001 * (error + padded_error)), name


def _best_rates(stdout: str, unit: str) -> dict[str, float]:
    """``name: 1,234.5 <unit> ...`` lines as {name: rate}."""
    rates = {}
    for line in stdout.splitlines():
        if unit in line:
            name, rest = line.split(":", 1)
            rates[name.strip()] = float(rest.split()[0].replace(",", ""))
    return rates


SIDE_BY_SIDE = {  # name: (script and tiny arguments, rate unit, (numerator, denominator), the ratio's label)
    "overhead masked_lm": (
        ["overhead.py", "--task", "masked_lm", "--batch", "8", "--seq", "32", "--steps", "2", "--rounds", "1"],
        "seq/s best",
        ("trainer", "plain loop"),
        "ratio trainer/plain: ",
    ),
    "overhead causal_lm": (
        ["overhead.py", "--task", "causal_lm", "--batch", "8", "--seq", "32", "--steps", "2", "--rounds", "1"],
        "seq/s best",
        ("trainer", "plain loop"),
        "ratio trainer/plain: ",
    ),
    "text_loader": (
        ["text_loader.py", "--seq", "32", "--batch", "8", "--batches", "3", "--rounds", "1", "--steps", "1"],
        "tokens/s best",
        ("token store", "tokenized on the fly"),
        "ratio store / on the fly: ",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SIDE_BY_SIDE)
def test_language_side_by_side_benches_print_both_rates_and_their_ratio(name):
    """The trainer against a hand loop on BERT and on a GPT; the token store against tokenizing on the fly."""
    args, unit, (numerator, denominator), label = SIDE_BY_SIDE[name]
    result = bench(*args)
    assert result.returncode == 0, result.stderr
    rates = _best_rates(result.stdout, unit)
    assert set(rates) == {numerator, denominator} and min(rates.values()) > 0
    shown = float(result.stdout.split(label)[1].split()[0])
    assert shown == pytest.approx(rates[numerator] / rates[denominator], abs=0.01)
    if name == "text_loader":
        assert sum("training:" in line and "% of a step" in line for line in result.stdout.splitlines()) == 2


@pytest.mark.slow
def test_gpt_step_bench_compares_adamw_muon_and_the_document_mask_at_nanogpts_flops():
    result = bench("gpt_step.py", "--seq", "32", "--steps", "1", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    # gpt_tiny: 2 blocks of 12·128² weights and two LayerNorms (4·128), the head 8,192 (the
    # vocabulary padded to 64s) x 128: N = 1,442,816; 6·N + 12·2·128·32 = 8,755,200 per token
    assert "batch 8 x 32 tokens, 1 steps x 1 rounds, 8.8 MFLOP per token" in result.stdout
    rows = [line.split(" | ")[0].strip("| ") for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows[2:] == ["adamw", "muon", "adamw, document mask"]


@pytest.mark.slow
def test_gpt_bench_times_each_recipe_to_the_published_rates_final_loss(tmp_path):
    """One rate (the published one): three runs, each in its own process; the tuned baseline's choice
    among several rates is the next test's."""
    result = bench(
        "gpt.py", "--steps", "8", "--eval-every", "4", "--rates", "6e-4", "--out", str(tmp_path),
        "--plot", str(tmp_path / "p.png"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| gpt")}
    assert list(rows) == ["gpt125", "gpt125_mosaic", "gpt_speedrun"]
    assert "tuned baseline: gpt125 (" in result.stdout  # the only gpt125 run
    # the published-rate run reaches its own final loss at its end: 1.00x on both columns
    assert rows["gpt125"].rstrip().endswith("| 1.00x | 1.00x |")
    for folder in ("gpt125", "gpt125_mosaic", "gpt_speedrun"):
        assert len(read_metrics(tmp_path / folder / "round1")) == 2  # evaluations at steps 4 and 8
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_gpt_benchs_tuned_baseline_is_the_gpt125_rate_with_the_lowest_final_loss(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpt

    monkeypatch.setattr(gpt, "published_rate", lambda: 6e-4)
    runs = gpt.run_list([6e-4, 3e-3, 1e-2])
    assert list(runs) == ["gpt125", "gpt125 lr 0.003", "gpt125 lr 0.01", "gpt125_mosaic", "gpt_speedrun"]
    assert runs["gpt125 lr 0.003"] == ("gpt125", ["optimizer.lr=0.003"])
    final = {"gpt125": 4.0, "gpt125 lr 0.003": 3.5, "gpt125 lr 0.01": 3.9, "gpt125_mosaic": 3.0, "gpt_speedrun": 2.0}
    assert gpt.tuned_baseline(runs, final) == "gpt125 lr 0.003"  # the other recipes are not candidates


@pytest.mark.slow
def test_corpus_benches_make_a_corpus_and_compare_write_text_with_datasets(tmp_path):
    pytest.importorskip("datasets")
    made = bench("make_corpus.py", str(tmp_path / "corpus"), "--mb", "1")
    assert made.returncode == 0, made.stderr
    assert {"corpus.parquet", "corpus.jsonl.gz", "corpus.json"} <= {p.name for p in (tmp_path / "corpus").iterdir()}
    result = bench("write_text.py", str(tmp_path / "corpus"), "--workers", "1", "--vocab", "600")
    assert result.returncode == 0, result.stderr
    assert "1 workers: write-text " in result.stdout and "x as fast as datasets, " in result.stdout


@pytest.mark.slow
def test_window_loader_bench_prints_every_source_and_worker_count():
    args = ["--windows", "--tokens", "200000", "--seq", "64", "--batch", "4", "--batches", "3", "--rounds", "1"]
    result = bench("text_loader.py", *args)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if " workers: " in line]
    assert len(lines) == 9 and all("x a GPU's need" in line and "x slower)" in line for line in lines)


@pytest.mark.slow
@pytest.mark.distributed
def test_sharding_bench_prints_a_ranks_memory_under_fsdp_against_ddp_and_each_checkpointing_mode():
    result = bench("sharding.py", "--ranks", "2", "--seq", "64")
    assert result.returncode == 0, result.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert rows["fsdp"].endswith("| 0.500x |")  # weights, gradients and AdamW's state: half of DDP's per rank
    assert {"none", "selective", "full"} <= rows.keys()
    speed = bench("sharding.py", "speed", "--model", "llama_tiny", "--batch", "1", "--seq", "32", "--steps", "1")
    assert speed.returncode == 0, speed.stderr
    assert "| ddp, bf16 |" in speed.stdout and "| fsdp, bf16 |" in speed.stdout
    assert "| fp8 | bad value for 'precision': 'fp8' needs a GPU" in speed.stdout


def test_estimate_check_estimates_the_gpus_shapes_and_says_it_measures_a_gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import estimate_check

    assert estimate_check.estimated("llama_tiny", 512, "fsdp", 1, 64, "selective") > 0  # as the GPU call runs it
    if not torch.cuda.is_available():
        result = bench("estimate_check.py")
        assert result.returncode == 1 and "measures a GPU" in result.stderr


@pytest.mark.slow
def test_segmentation_data_bench_prepares_crops_and_evaluates_generated_cases(tmp_path):
    args = ["--cases", "2", "--shape", "16", "40", "40", "--workers", "0", "1", "--patch", "16", "16", "16"]
    args += ["--crops", "3", "--eval-patches", "64", "--window-batches", "1", "--predict-cases", "1"]
    args += ["--predict-patch", "32", "32"]
    result = bench("segmentation_data.py", str(tmp_path), *args)
    assert result.returncode == 0, result.stderr
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    prepared = [row for row in rows if row[0] in ("| 0", "| 1")]
    assert len(prepared) == 2 and prepared[0][4] == prepared[1][4]  # the same store bytes a case either way
    assert "loader workers of this CPU" in result.stdout
    assert any(row[0] == "| 64^3" and row[1] == "1" for row in rows)  # one case evaluated, its memory measured
    (predicted,) = [row for row in rows if row[0] == "| [32, 32]"]  # predict's steps timed, a label map written
    assert float(predicted[-2]) > 0 and len(list((tmp_path / "predicted").glob("*.nii.gz"))) == 1


def test_peers_bench_refuses_a_nanogpt_folder_without_its_train_py(tmp_path):
    result = bench("peers.py", "--only", "gpt", "--nanogpt", str(tmp_path))
    assert result.returncode != 0
    assert f"--nanogpt {tmp_path}: no train.py there" in result.stderr


def test_peers_bench_hands_nanogpt_the_token_stream_trainrun_trains_on_and_scores_both_alike(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import peers
    import peers_shared

    stream = torch.arange(1, 64 * 5 + 2) % 50
    windows = torch.stack([stream[i * 64 : i * 64 + 65] for i in range(5)])
    checkout = tmp_path / "nanoGPT"
    checkout.mkdir()
    (checkout / "configurator.py").write_text("")
    work = peers.nanogpt_workdir(checkout, tmp_path / "out", windows, windows[:2], 50)
    data = work / "data" / "trainrun"
    assert np.array_equal(np.fromfile(data / "train.bin", dtype=np.uint16), stream.numpy())
    assert np.array_equal(np.fromfile(data / "val.bin", dtype=np.uint16), stream[: 2 * 64 + 1].numpy())
    assert pickle.loads((data / "meta.pkl").read_bytes()) == {"vocab_size": 50}
    assert (work / "configurator.py").resolve() == checkout / "configurator.py"
    # the evaluator: uniform logits score ln(vocabulary) per token, whatever the targets
    uniform = peers_shared.next_token_loss(lambda x, y: torch.zeros(*x.shape, 50), windows)
    assert uniform == pytest.approx(math.log(50))
    steps = [9.0, 9.0] + [0.1] * 18 + [0.2] * 10
    assert peers_shared.step_ms(steps) == pytest.approx(100.0)  # the first tenth (>= 2) left out


@pytest.mark.slow
def test_the_checkpointing_and_block_mask_benches_run_tiny():
    """Checkpointing's host cost per policy, and the block mask from document boundaries against
    create_block_mask (which the bench checks equal block by block)."""
    policies = bench("checkpointing.py", "--steps", "1", "--rounds", "1", "--seq", "16")
    assert policies.returncode == 0, policies.stderr
    rows = [line for line in policies.stdout.splitlines() if line.startswith(("| selective", "| full"))]
    assert len(rows) == 3
    masks = bench("block_mask.py", "--lengths", "300", "--batch", "2", "--window", "200", "--rounds", "1")
    assert masks.returncode == 0, masks.stderr
    assert "| 300 | trainrun |" in masks.stdout


NANOGPT = ROOT / ".peers" / "nanoGPT"  # scripts/gpu_wheels.sh NANOGPT=DIR copies a checkout here; none in CI


@pytest.mark.slow
@pytest.mark.parametrize("sections", [("bert",), ("llama",), ("resnet",), ("gpt",)])
def test_the_gpu_peer_sections_run_at_tiny_size_on_a_cpu(tmp_path, sections):
    """``bench/peers.py --device cuda``'s sections at ``--scale tiny``: every side (trainrun as a user
    runs it; Trainer eager and compiled, Lightning, the bare step, nanoGPT where a checkout is here)
    launched in its own process, scored, and each ratio printed, so that a GPU's minutes measure."""
    args = ["--scale", "tiny", "--rounds", "1", "--only", *sections, "--out", str(tmp_path)]
    if (NANOGPT / "train.py").is_file():
        args += ["--nanogpt", str(NANOGPT)]
    result = bench("peers.py", *args)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "failed" not in text and "cut:" not in text and "stopped:" not in text, text
    if sections == ("gpt",) and "--nanogpt" not in args:  # CI: no nanoGPT checkout, said in one line
        assert "gpt: skipped (give a nanoGPT checkout" in text, text
        return
    table = [line.split("|") for line in text.splitlines() if re.match(r"^\| (?!side |---)", line)]
    rows = {cells[1].strip() for cells in table}
    assert table and all(float(cells[2].replace(",", "")) > 0 for cells in table), text  # each side's rate
    ratios = set(re.findall(r"^(\w+): (.+?)'s step time / trainrun's", text, re.MULTILINE))
    sides = {
        "bert": ["Trainer", "Trainer, compiled"],
        "llama": ["Trainer", "Trainer, compiled"],
        "resnet": ["Lightning", "bare model step"],
        "gpt": ["nanoGPT"],
    }
    for section in sections:
        assert set(sides[section]) <= rows and {(section, peer) for peer in sides[section]} <= ratios, text
    assert {"trainrun", "trainrun, channels-last", "trainrun, mild"} & rows
    if "gpt" in sections:
        assert "to nanoGPT's final loss" in text, text


@pytest.mark.slow
def test_published_load_bench_prints_what_each_way_of_reading_a_folder_adds(tmp_path):
    args = ["--width", "64", "--layers", "2", "--vocab", "300", "--shard", "50KB"]
    result = bench("published_load.py", str(tmp_path), *args)
    assert result.returncode == 0, result.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert {"trainrun", "whole files"} <= set(rows) and "whole files / trainrun, memory added: " in result.stdout
    assert "safetensors file(s)" in result.stdout and len(list(tmp_path.glob("*/*.safetensors"))) > 1


def test_a_rows_unknown_setting_is_counted_only_where_it_does_not_change_the_estimate(monkeypatch):
    """A row whose source leaves a setting out is tried at each value its ``unknown`` names: counted
    where the estimates agree, an assumption (not counted) where they differ, and it says which."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import estimate_validation

    def estimated(row: dict, extra: list[str]) -> estimate_validation.Checked:
        value = {"data.samples=[1000,10]": 10.0, "data.samples=[9000,10]": float(row["second"])}[extra[0]]
        return estimate_validation.Checked(row, 10.0, value, "min", "", "measured", "GPU", 0.5, False)

    monkeypatch.setattr(estimate_validation, "estimated_with", estimated)
    unknown = {"what": "the training set's size", "values": ["data.samples=[1000,10]", "data.samples=[9000,10]"]}
    same = estimate_validation.estimate_row({"unknown": unknown, "second": 10.0})
    other = estimate_validation.estimate_row({"unknown": unknown, "second": 12.0})
    assert same.counted and "counted: the training set's size is not published" in estimate_validation.verdict(same)
    assert not other.counted
    assert "not counted: assumes the training set's size, which changes" in estimate_validation.verdict(other)


@pytest.mark.slow
def test_the_estimate_holds_every_published_row_and_the_documented_table(monkeypatch):
    """bench/published_times.yaml through trainrun estimate: each fit row reproduces its figure within
    1 % (or, where its generation's convolutions have no traffic bound, is slower than its figure),
    at most one published row a generation is a fit, the counted predictions within 25 % are no
    fewer than before; docs/estimate.md's table is this run's."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import estimate_validation

    from trainrun.estimate.device import generations

    checked = list(estimate_validation.estimate_rows(estimate_validation.rows()))
    fits = [item for item in checked if {"fits", "calibrates"} & item.row.keys()]
    for item in fits:  # or, where no traffic bound reaches it, it ran faster than its estimate without one
        unbounded = "fits" in item.row and not generations()[item.row["fits"]].traffic_bound
        assert item.step_ratio < 1 if unbounded else item.ratio == pytest.approx(1, abs=0.01), item.row["id"]
    declared = [item.row["fits"] for item in fits if "fits" in item.row]
    assert len(declared) == len(set(declared))
    counted = [item for item in checked if item.counted]
    assert sum(item.within_goal for item in counted) >= COUNTED_WITHIN_GOAL
    assert estimate_validation.markdown(checked) == estimate_validation.documented()


@pytest.mark.slow
def test_the_fit_reproduces_the_generations_from_their_declared_fit_set(monkeypatch):
    """bench/fit_generations.py on the readings marked ``fit`` gives hopper's shares as
    generations.yaml holds them, reading no row of the published table but the one each other
    generation declares."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import fit_generations

    from trainrun.estimate.datasheets import rates
    from trainrun.estimate.device import generations

    steps = [fit_generations.read_step(row) for row in rates().gpu if row.fit]
    fitted, held = fit_generations.fit_hopper(steps), generations()["hopper"]
    for name in fit_generations.PARAMETERS:
        assert getattr(fitted, name) == pytest.approx(getattr(held, name), rel=0.01), name


def test_operations_bench_times_each_kind_of_operation_and_step_beside_the_estimate():
    """``bench/operations.py --cpu`` (the GPU window's second call, tiny on this CPU): each kind of
    operation the estimate times and a whole step of a timm and a transformers model, each with the
    estimate's time on the H200's group, the time measured here and their ratio."""
    result = bench("operations.py", "--cpu", "--steps", "4", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| ") and " ms |" in line]
    kinds = {row[0].lstrip("| ") for row in rows}
    assert kinds == {"matmul", "convolution", "depthwise", "grouped", "attention", "memory", "training step"}
    assert all(float(row[3].removesuffix(" ms")) > 0 and row[4].rstrip(" |") != "-" for row in rows), result.stdout
    assert "estimated on hardware=8xh200, measured on this CPU" in result.stdout
    from trainrun.estimate.device import generations

    (floor,) = [row for row in rows if row[1] == "add of 2 x 1"]  # one element: the floor an operation costs
    assert floor[2] == f"{generations()['hopper'].floor_s * 1e3:.3f} ms"


def test_forward_backward_bench_splits_a_timm_models_error_between_its_forward_and_its_step():
    """``bench/forward_backward.py``: a model's published forward and step over the estimate's, and
    each's step over its forward; its training rates are the validation's where it has the model."""
    import yaml

    with mock.patch.object(sys, "path", [str(ROOT / "bench"), *sys.path]):
        from forward_backward import PUBLISHED

    rows = yaml.safe_load((ROOT / "bench" / "published_times.yaml").read_text())["rows"]
    settings = [
        dict(item.split("=") for item in row["settings"]) | row["published"]
        for row in rows
        if row["id"].startswith("timm_3090_") and row["published"]["over"] == "step"
    ]
    validated = {row["model.arch"]: (row["rate"], int(row["train_batch_size"])) for row in settings}
    shared = validated.keys() & PUBLISHED.keys()
    assert len(shared) == 5 and all(validated[model] == PUBLISHED[model][1:] for model in shared)
    result = bench("forward_backward.py", "--models", "mobilenetv2_100")
    assert result.returncode == 0, result.stderr
    (row,) = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| mobilenetv2_100")]
    forward, step, published, estimated = (float(cell.strip(" |")) for cell in row[1:])
    assert 0.8 < forward < 1.2 and step > forward and published > 4 > estimated > 3


COUNTED_WITHIN_GOAL = 86  # counted predictions within 25 % of their figures: never fewer
RECIPES = sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))
ON_ONE_GPU = {"unet3d_brats": "nnU-Net's batch of 2 trains on one GPU: 8 ranks are refused in one line"}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_is_estimated_on_8_a100s_with_its_bottleneck(recipe):
    """The command the estimate's issue names, for every recipe: fits or not, a bottleneck for every
    phase, and a time (to the target where the recipe publishes its samples)."""
    result = run_cli("estimate", f"recipe={recipe}", "launcher.devices=8", "hardware=8xa100_aws", "--json")
    if recipe in ON_ONE_GPU:
        assert result.returncode == 2 and "does not divide among 8 processes" in result.stderr, result.stderr
        return
    assert result.returncode in (0, 3), result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["fits"] is (result.returncode == 0)
    assert estimate["phases"] and all(phase["bottleneck"] for phase in estimate["phases"])
    assert estimate["hours"] or estimate.get("schedule_hours") or estimate["schedule_steps"] is None
    from trainrun.config import compose
    from trainrun.validation import validate

    config = validate(compose([f"recipe={recipe}", "launcher.devices=8", "hardware=8xa100_aws"]), files=False)
    if config.stop_at is not None and config.target_samples is not None:  # the recipe's published samples
        assert (estimate["time_to"], estimate["target_source"]) == (
            "target",
            f"target_samples={config.target_samples:,}",
        )
        assert estimate["steps"] == math.ceil(config.target_samples / config.train_batch_size) and estimate["hours"]
    else:
        assert estimate["time_to"] == "schedule" and estimate["target_source"] is None


def test_explorer_bench_times_a_page_of_explorers_scale_in_chromium_and_draws_its_picture(tmp_path):
    """At its full 5,000 runs (about 8 s here): every one drawn, each change timed; the 2 s the bench
    holds them to is its own figure (docs/benchmarks.md), so a loaded machine is allowed 10 s."""
    result = bench("explorer.py", str(tmp_path), "--runs", "5000", "--limit", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5000 runs: trainrun explore built the page" in result.stdout
    assert f"runs drawn at opening: {5000 + len(published_runs()[0])}" in result.stdout
    for change in ("open the page", "hide a recipe", "require a method", "time to cost", "type a target"):
        assert re.search(rf"{change}: +\d+ ms", result.stdout), change
    picture = tmp_path / "page.png"
    assert bench("explorer.py", "--shot", str(tmp_path / "explorer.html"), str(picture)).returncode == 0
    assert picture.read_bytes()[:4] == b"\x89PNG"


def test_brought_bench_puts_trainrun_beside_trainer_on_a_transformers_model(tmp_path):
    """bench/brought.py's transformers section, tiny: both sides from one folder, one evaluator, a ratio."""
    result = bench("brought.py", "--only", "transformers", "--steps", "4", "--rounds", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert {"trainrun", "Trainer"} <= set(rows)
    assert re.search(r"Trainer's step / trainrun's: \*\*[\d.]+x\*\*", result.stdout)
    assert "AVX" in result.stdout  # the kind of machine beside every timing


def test_brought_bench_refuses_a_timm_folder_without_its_train_py(tmp_path):
    result = bench("brought.py", "--only", "timm", "--timm", str(tmp_path), "--out", str(tmp_path))
    assert result.returncode != 0 and f"--timm {tmp_path}: no train.py there" in result.stderr


def test_brought_bench_reads_timms_logged_update_times():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import brought
    finally:
        sys.path.remove(str(ROOT / "bench"))
    logged = (
        "Train: 0 [   0/43 (  2%)]  Loss: 2.41 (2.41)  Time: 2.657s,   12.04/s  (2.657s,   12.04/s)  LR: 1.000e-01\n"
        "Train: 0 [  42/43 (100%)]  Loss: 1.10 (1.80)  Time: 0.351s,   91.17/s  (0.500s,   64.00/s)  LR: 1.000e-01\n"
    )
    assert brought.TIMM_UPDATE.findall(logged) == [("0", "2.657"), ("42", "0.351")]
