"""Time accounting per step, bottlenecks, trade-off curves, reports and sweeps."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import TINY, run_here

from trainrun.commands.report import report_command
from trainrun.core import accounts as accounts_module
from trainrun.core.accounts import BUCKETS, TimeAccounts
from trainrun.core.bottleneck import find_bottleneck
from trainrun.report import curves
from trainrun.report.runs import FIRST_EPOCH_AS_SECOND, Pricing, Run, find_runs, load_run


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_accounts_charge_each_second_to_one_bucket_and_each_step_to_one_row(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(accounts_module.time, "perf_counter", clock)
    accounts = TimeAccounts(record_steps=True)
    for step, spent in ((1, {"data": 1, "forward": 2, "backward": 3, "eval": 5}), (2, {"data": 0.5, "optimizer": 1})):
        accounts.begin_step(step, "other")
        for bucket, seconds in spent.items():
            accounts.switch(bucket)
            clock.now += seconds
    accounts.begin_step(3, "other")
    rows = accounts.take_rows()
    assert [row["step"] for row in rows] == [1, 2]
    spent = [{k: v for k, v in row.items() if v and k != "step"} for row in rows]
    assert spent == [{"data": 1, "forward": 2, "backward": 3, "eval": 5}, {"data": 0.5, "optimizer": 1}]
    assert accounts.total() == 12.5 and accounts.train_seconds() == 7.5  # eval excluded
    assert accounts.take_rows() == []  # each row is handed over once
    resumed = TimeAccounts()
    resumed.start(accounts.state_dict())
    assert resumed.seconds == accounts.seconds and set(resumed.seconds) == set(BUCKETS)


def test_bottleneck_names_the_largest_part_with_both_amdahl_bounds():
    wall = {"data": 3, "to_device": 1, "forward": 2, "backward": 3, "optimizer": 1, "eval": 5, "checkpoint": 1}
    wall["other"] = 1
    found = find_bottleneck(wall)
    assert (found.train_seconds, found.compute_seconds, found.input_seconds, found.host_seconds) == (11, 6, 4, 1)
    assert found.bottleneck == "compute" and found.share == pytest.approx(6 / 11)
    assert found.speedup_if_rest_free == pytest.approx(11 / 6)
    assert found.speedup_if_bottleneck_free == pytest.approx(11 / 5)
    assert "device compute" in found.sentence and "1.83x" in found.sentence and "2.20x" in found.sentence
    # On CUDA compute is device time; the data wait counts only while the device had nothing to do.
    on_gpu = find_bottleneck(wall, {"to_device": 0.5, "forward": 1, "backward": 2, "optimizer": 0.5, "algorithms": 0.5})
    assert (on_gpu.compute_seconds, on_gpu.input_seconds, on_gpu.host_seconds) == (4, 4, 3)
    assert on_gpu.clock == "cuda events"
    data_bound = find_bottleneck({"data": 8, "forward": 1, "backward": 1})
    assert data_bound.bottleneck == "input" and data_bound.speedup_if_rest_free == pytest.approx(10 / 8)


def _run(label: str, budget: float, top1: float, seconds: float, seed: int = 0, price: float | None = 2.0) -> Run:
    return Run(
        path=Path(f"/runs/{label}/{budget}/{seed}"),
        label=label,
        budget=budget,
        seed=seed,
        status="completed",
        quality=top1,
        train_seconds=seconds,
        time_source="measured",
        nodes=1,
        pricing=Pricing("test", price),
        quality_targets=(),
        summary={},
    )


def test_pareto_frontier_and_time_to_accuracy_interpolate_between_budgets():
    curve = curves.points(
        [_run("a", 0.25, 0.80, 10), _run("a", 0.5, 0.90, 20), _run("a", 0.75, 0.85, 30), _run("a", 1.0, 0.95, 40)]
    )
    assert [p.budget for p in curves.pareto(curve, curves.seconds)] == [0.25, 0.5, 1.0]  # 0.75 is dominated
    assert curves.reach(curve, 0.85, curves.seconds) == curves.Reach(pytest.approx(15.0), at_most=False)
    assert curves.reach(curve, 0.925, curves.seconds) == curves.Reach(pytest.approx(30.0), at_most=False)
    assert curves.reach(curve, 0.70, curves.seconds) == curves.Reach(10.0, at_most=True)
    assert curves.reach(curve, 0.96, curves.seconds) is None
    assert curves.reach(curve, 0.85, curves.cost).value == pytest.approx(15 / 3600 * 2.0)


def test_the_frontier_keeps_one_point_per_cost_and_drops_equal_accuracy_at_a_higher_cost():
    tied_cost = curves.points([_run("a", 0.5, 0.80, 10), _run("b", 0.5, 0.90, 10), _run("c", 1.0, 0.90, 20)])
    assert [(p.label, p.budget) for p in curves.pareto(tied_cost, curves.seconds)] == [("b", 0.5)]
    untimed = _run("a", 2.0, 0.99, 0)
    untimed = dataclasses.replace(untimed, train_seconds=None)  # a run whose time was never recorded
    assert [p.budget for p in curves.points([untimed, _run("a", 1.0, 0.9, 5)])] == [1.0]
    (single,) = curves.points([_run("a", 1.0, 0.9, 5)])
    assert single.quality_spread == 0.0 and single.seconds_spread == 0.0  # one seed: no spread


def test_a_speedup_at_a_target_says_which_side_is_only_a_bound():
    exact, cheapest = curves.Reach(20.0, at_most=False), curves.Reach(10.0, at_most=True)
    assert curves.speedup(exact, curves.Reach(10.0, at_most=False)) == curves.Speedup(2.0, "")
    assert curves.speedup(exact, cheapest) == curves.Speedup(2.0, ">=")  # the recipe needs at most 10 s
    assert curves.speedup(curves.Reach(20.0, at_most=True), curves.Reach(40.0, False)) == curves.Speedup(0.5, "<=")
    assert curves.speedup(curves.Reach(20.0, at_most=True), cheapest) is None  # two upper bounds
    assert curves.speedup(None, exact) is None and curves.speedup(exact, None) is None


def test_seeds_average_into_one_point_with_their_spread():
    (point,) = curves.points([_run("a", 1.0, 0.90, 10, seed=0), _run("a", 1.0, 0.94, 14, seed=1)])
    assert point.seeds == 2 and point.quality == pytest.approx(0.92) and point.seconds == 12
    assert point.quality_spread == pytest.approx(0.02 * 2**0.5) and point.quality_range == (0.90, 0.94)


def _write_run(directory: Path, label: str, budget: float, top1: float, seconds: float, **summary) -> Path:
    directory.mkdir(parents=True)
    config = {"name": label, "scale_schedule_ratio": budget, "seed": 0, "quality_targets": [0.9]}
    config["hardware"] = {"name": "8xa100_aws", "price_per_hour": 36.0}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    base = {"status": "completed", "final_top1": top1, "train_seconds": seconds, "batches_per_epoch": 2}
    (directory / "summary.json").write_text(json.dumps(base | summary))
    return directory


def test_budgeted_runs_are_drawn_by_budget_and_auto_runs_judged_against_the_swept_frontier(tmp_path):
    for budget, top1, seconds, seed in (("10s", 0.70, 10.2, 0), ("10s", 0.74, 9.9, 1), ("20s", 0.85, 20.1, 0)):
        run = _write_run(tmp_path / "sweep" / f"budget{budget}-seed{seed}", "mild", 1.0, top1, seconds)
        config = yaml.safe_load((run / "config.yaml").read_text()) | {"max_duration": budget, "seed": seed}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    auto = _write_run(tmp_path / "auto", "mild", 1.7, 0.72, 15.0)
    config = yaml.safe_load((auto / "config.yaml").read_text()) | {"max_duration": "15s"}
    (auto / "config.yaml").write_text(yaml.safe_dump(config))
    decision = {"chosen": "mild", "predicted_quality": 0.78, "budget_seconds": 15.0}
    (auto / "auto.json").write_text(json.dumps(decision))
    out = tmp_path / "out"
    assert report_command([str(tmp_path / "sweep"), str(auto), "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert [(r["recipe"], r["budget"], r["seeds"]) for r in rows] == [
        ("auto", "15s", "1"),
        ("mild", "10s", "2"),
        ("mild", "20s", "1"),
    ]
    assert (out / "tradeoff_budget.png").read_bytes()[:4] == b"\x89PNG"
    markdown = (out / "report.md").read_text()
    # within 15 s the best swept point is mild at 10 s: 72.00% +- sd of (70%, 74%) = 2.83%
    assert "| 15s | 0 | mild | 78.00% | 72.00% | 15.0 | mild 10s: 72.00% ± 2.83% in 10.1 s | yes |" in markdown


def test_report_gives_speedups_at_the_baselines_accuracy_and_writes_every_file(tmp_path, capsys):
    for budget, top1, seconds in ((0.5, 0.80, 100), (1.0, 0.90, 200)):
        _write_run(tmp_path / "base" / f"ssr{budget}", "baseline", budget, top1, seconds)
    for budget, top1, seconds in ((0.5, 0.85, 60), (1.0, 0.92, 120)):
        _write_run(tmp_path / "fast" / f"ssr{budget}", "fast", budget, top1, seconds)
    _write_run(tmp_path / "fast" / "broken", "fast", 0.25, None, 5.0, status="failed")
    out = tmp_path / "out"
    assert report_command([str(tmp_path / "base"), str(tmp_path / "fast"), "--out", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    # fast reaches the baseline's 90% at 60 + (0.90-0.85)/(0.92-0.85) * 60 s; the baseline needed 200 s.
    speedup = 200 / (60 + 0.05 / 0.07 * 60)
    assert f"| fast | 1 | 90.00% | 200.0 | {60 + 0.05 / 0.07 * 60:.1f} | {speedup:.2f}x |" in markdown
    assert "| fast | 0.5 | 80.00% | 100.0 | 60.0 | >=1.67x |" in markdown  # fast's cheapest point already beats it
    assert f"| fast | {speedup:.2f}x / {speedup:.2f}x |" in markdown  # at the runs' target, 90%: time / cost
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert [(r["recipe"], r["budget"], r["pareto_time"]) for r in rows] == [
        ("baseline", "0.5", "0"),
        ("baseline", "1", "0"),
        ("fast", "0.5", "1"),
        ("fast", "1", "1"),
    ]
    assert float(rows[3]["cost_mean"]) == pytest.approx(120 / 3600 * 36.0)
    assert (out / "tradeoff_time.png").read_bytes()[:4] == b"\x89PNG" and (out / "tradeoff_cost.png").is_file()
    assert "failed" in capsys.readouterr().out  # listed among the runs, not made into a point


def test_first_epoch_can_be_timed_as_the_second(tmp_path):
    run_dir = _write_run(tmp_path / "run", "x", 1.0, 0.9, 10.0)
    steps = [(1, 3.0), (2, 2.0), (3, 1.0), (4, 1.0), (5, 1.5), (6, 1.5)]
    rows = [{"step": s, "data": t / 2, "forward": t / 2, "eval": 9.0} for s, t in steps]
    (run_dir / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    measured, note = load_run(run_dir)
    adjusted, note = load_run(run_dir, first_epoch_as_second=True)
    assert measured.train_seconds == 10.0 and note is None
    assert adjusted.train_seconds == 10.0 - 5.0 + 2.0 and adjusted.time_source == FIRST_EPOCH_AS_SECOND
    (run_dir / "steps.jsonl").write_text("")
    kept, note = load_run(run_dir, first_epoch_as_second=True)
    assert kept.train_seconds == 10.0 and "epoch 1 kept as measured" in note


def test_step_rows_add_up_to_the_run_totals(trained_run):
    rows = [json.loads(line) for line in (trained_run / "steps.jsonl").read_text().splitlines()]
    summary = json.loads((trained_run / "summary.json").read_text())
    assert [row["step"] for row in rows] == list(range(1, 45))
    for bucket in ("data", "forward", "backward", "optimizer", "eval"):
        assert sum(row[bucket] for row in rows) == pytest.approx(summary["time_breakdown"][bucket], abs=1e-3)
    assert [row["step"] for row in rows if row["eval"] > 0] == [22, 44]  # evaluation after steps 22 and 44
    compute = sum(summary["time_breakdown"][b] for b in ("forward", "backward", "optimizer", "algorithms"))
    assert summary["bottleneck"]["compute_seconds"] == pytest.approx(compute)
    assert summary["bottleneck"]["clock"] == "wall clock" and summary["device_time_breakdown"] is None
    timed = ("data", "to_device", "forward", "backward", "optimizer", "algorithms", "other")
    second_epoch = sum(row[bucket] for row in rows[22:] for bucket in timed)
    steady = summary["bottleneck_after_first_epoch"]  # the second epoch alone
    assert steady["train_seconds"] == pytest.approx(second_epoch, abs=0.01)


def test_profiled_prefix_extrapolates_the_full_run(tmp_path):
    args = ["max_duration=4ep", "profile_prefix=30ba", "algorithms=[progressive_resizing]"]
    result = run_here(*TINY, *args, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    extrapolated = summary["extrapolated"]
    assert summary["status"] == "profiled" and summary["batches"] == 30
    assert (extrapolated["label"], extrapolated["from_batches"], extrapolated["to_batches"]) == ("extrapolated", 30, 88)
    expected = extrapolated["measured_train_seconds"] + 58 * extrapolated["seconds_per_step"]
    assert extrapolated["train_seconds"] == pytest.approx(expected)
    assert extrapolated["caveat"].startswith("the step cost varies along the schedule (progressive_resizing)")
    assert "extrapolated:" in result.stdout
    report = run_here("report", str(tmp_path))
    assert report.returncode == 0, report.stderr
    assert "(extrapolated from 30/88 steps; step cost varies" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_sweep_trains_each_budget_once_and_reports(tmp_path):
    args = ["sweep", *TINY, "name=tiny", "budgets=[0.5,1.0]", f"out={tmp_path / 'sweep'}", "hardware=cpu_2vcpu_aws"]
    first = run_here(*args, cwd=tmp_path)  # the sweep here, its runs in their processes
    assert first.returncode == 0, first.stderr
    sweep = tmp_path / "sweep"
    batches = {d.name: json.loads((d / "summary.json").read_text())["batches"] for d in sweep.glob("ssr*")}
    assert batches == {"ssr0.5": 22, "ssr1": 44}  # the budget stretches the run
    assert json.loads((sweep / "sweep.json").read_text())["runs"] == {"ssr0.5": "completed", "ssr1": "completed"}
    assert {"report.md", "report.csv", "tradeoff_time.png", "tradeoff_cost.png"} <= {p.name for p in sweep.iterdir()}
    before = (sweep / "ssr1" / "summary.json").read_text()
    again = run_here(*args, cwd=tmp_path)
    assert again.returncode == 0 and "2 runs (2 already done)" in again.stdout
    assert (sweep / "ssr1" / "summary.json").read_text() == before
    changed = run_here(*args, "optimizer.lr=0.05", cwd=tmp_path)
    assert changed.returncode == 2 and "holds a run with another config (optimizer.lr" in changed.stderr
    assert (sweep / "ssr1" / "summary.json").read_text() == before


BAD_SUBCOMMANDS = [
    (["sweep", "data=digits"], "'trainrun sweep' needs 'budgets', e.g. budgets=[0.25,0.5,1.0], or 'folds'"),
    (["sweep", "task=segmentation", "data=synthetic_brats", "model=unet2d", "folds=[0,5]"], "bad value for 'folds'"),
    (["sweep", "folds=all", "data.segmentation.fold=1"], "sets scale_schedule_ratio, seed, data.segmentation.fold"),
    (["sweep", "folds=all"], "bad value for 'folds': all (cross-validation folds are task=segmentation's)"),
    (["ensemble", "{empty}", "--data", "{empty}"], "is not a run: no summary.json in it or under it"),
    (["sweep", "budgets=[0,1]"], "bad value for 'budgets'"),
    (["sweep", "budgets=[1]", "seeds=[a]"], "bad value for 'seeds': 'a'"),
    (["sweep", "budgets=[1]", "seed=3"], "sets scale_schedule_ratio, seed and the run directory itself"),
    (["sweep", "budgets=[1]", "optimizer.lrr=1"], "unknown config key 'optimizer.lrr'"),
    (["sweep", "budgets=[10s,0.5]"], "bad value for 'budgets': [10s,0.5] (give schedule ratios, wall-clock"),
    (["sweep", "budgets=[10s]", "max_duration=5s"], "sets max_duration, seed and the run directory itself"),
    (["recipe=auto", "max_duration=2ep"], "recipe=auto needs a budget: max_duration=2ep is an amount of training"),
    (["recipe=auto", "max_duration=1min"], "recipe=auto needs a trade-off table for model=resnet_small with 10"),
    (
        ["recipe=auto", "max_duration=1min", "task=causal_lm", "data=stdlib_stream", "model=gpt_tiny"],
        "recipe=auto needs a trade-off table for model=gpt on task causal_lm and trainrun publishes none",
    ),
    (["recipe=auto", "max_duration=1min", "auto.table=/no/such.csv"], "'auto.table': '/no/such.csv' does not"),
    (["recipe=auto", "max_duration=1min", "scale_schedule_ratio=2"], "recipe=auto sets scale_schedule_ratio"),
    (["recipe=auto", "-m", "max_duration=1min"], "recipe=auto and -o1 decide one training run: they do not"),
    (["report", "/no/such/sweep"], "'/no/such/sweep' does not exist"),
    (["report", "{empty}"], "is not a run: no summary.json in it or under it"),
    (["report", "{run}", "--baseline", "nope"], "bad value for '--baseline': 'nope'"),
    (["report", "{run}", "--hardware", "abacus"], "unknown option 'abacus' for 'hardware'"),
    (["profile_prefix=0ba"], "bad value for 'profile_prefix'"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SUBCOMMANDS, ids=[" ".join(a) for a, _ in BAD_SUBCOMMANDS])
def test_bad_sweep_and_report_input_is_one_line(args, message, tmp_path):
    (tmp_path / "empty").mkdir()
    _write_run(tmp_path / "run", "x", 1.0, 0.9, 10.0)
    args = [a.replace("{empty}", str(tmp_path / "empty")).replace("{run}", str(tmp_path / "run")) for a in args]
    result = run_here(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainrun: error:") and message in lines[0], result.stderr
    assert not (tmp_path / "run" / "report.md").exists() and not any((tmp_path / "empty").iterdir())


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_cuda_runs_time_device_buckets_with_events(tmp_path):
    result = run_here(*TINY, "device=cuda", "precision=amp", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    device = summary["device_time_breakdown"]
    assert set(device) == {"to_device", "forward", "backward", "optimizer", "algorithms"} and device["backward"] > 0
    assert summary["bottleneck"]["clock"] == "cuda events"
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(rows) == 44 and all(row["device_forward"] > 0 for row in rows)
    assert sum(row["device_backward"] for row in rows) == pytest.approx(device["backward"], rel=1e-6)


def test_a_run_written_with_the_former_accuracy_targets_key_is_timed_to_its_targets(tmp_path):
    run = _write_run(tmp_path / "old", "mild", 1.0, 0.9, 5.0)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["accuracy_targets"] = config.pop("quality_targets") + [0.5]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    loaded, _ = load_run(run)
    assert loaded.quality_targets == (0.9, 0.5)


def test_runs_are_listed_by_the_value_of_their_budget_not_its_text(tmp_path):
    for budget, seconds in (("10s", 9.8), ("20s", 19.7), ("5s", 4.9)):
        run = _write_run(tmp_path / "sweep" / f"budget{budget}-seed0", "mild", 1.0, 0.8, seconds)
        config = yaml.safe_load((run / "config.yaml").read_text()) | {"max_duration": budget}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        summary = json.loads((run / "summary.json").read_text())
        summary["bottleneck"] = {
            "train_seconds": seconds, "compute_seconds": seconds, "input_seconds": 0.0, "host_seconds": 0.0,
            "bottleneck_name": "device compute", "speedup_if_rest_free": 1.0, "speedup_if_bottleneck_free": None,
            "clock": "wall clock",
        }  # fmt: skip
        (run / "summary.json").write_text(json.dumps(summary))
    assert report_command([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    markdown = (tmp_path / "out" / "report.md").read_text()
    for title in ("## where training time goes", "## runs"):
        table = markdown.split(title)[1].split("\n## ")[0]
        budgets = [line.split("|")[2].strip() for line in table.splitlines() if line.startswith("| mild")]
        assert budgets == ["5s", "10s", "20s"], title


def test_a_copy_of_a_run_under_the_scanned_folder_is_not_a_second_run(tmp_path):
    """MLflow's artifact store beside the runs (mlartifacts/<id>/artifacts/) holds a run's files again."""
    run = _write_run(tmp_path / "tracked" / "run", "mild", 1.0, 0.9, 5.0)
    (run / "steps.jsonl").write_text("")
    copy = tmp_path / "tracked" / "mlartifacts" / "1" / "abc" / "artifacts"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("steps.jsonl"))
    other = _write_run(tmp_path / "tracked" / "other", "mild", 1.0, 0.8, 5.0)  # another run: kept
    assert sorted(find_runs([tmp_path / "tracked"])) == sorted([other, run])
    hand_copy = tmp_path / "tracked" / "zz-copy"  # copied by hand, step log and all: the first found is read
    shutil.copytree(run, hand_copy)
    assert len(find_runs([tmp_path / "tracked"])) == 2
