"""recipe=auto and -o1: the choice rules by numbers on hand-made tables and timings, and one
real recipe=auto run end to end."""

import contextlib
import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, run_here

from trainrun.choose.profiling import Profile, ProfileFailed
from trainrun.choose.recipes import (
    PUBLISHED_TABLES,
    Candidate,
    TablePoint,
    best_candidate,
    plan_candidate,
    predict,
    read_table,
)
from trainrun.choose.systems import NOISE, SystemsSearch, apply_settings, systems_options
from trainrun.config import compose
from trainrun.errors import ConfigError
from trainrun.validation import validate

HAND_MADE = [  # recipe, budget (ratio), epochs, top-1
    ("slow", 0.5, 4, 0.80),
    ("slow", 1.0, 8, 0.90),
    ("fast", 0.5, 4, 0.70),
    ("fast", 1.0, 8, 0.85),
    ("fast", 2.0, 16, 0.89),
]


def write_table(path, rows=HAND_MADE):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["recipe", "budget", "epochs_mean", "seeds", "top1_mean", "top1_sd"])
        for recipe, ratio, epochs, quality in rows:
            writer.writerow([recipe, ratio, epochs, 1, quality, 0.0])
        writer.writerow(["slow", "30s", 5, 1, 0.5, 0.0])  # a wall-clock budget's row is not a table point
    return path


def test_table_rows_become_points_per_recipe_sorted_by_epochs(tmp_path):
    table = read_table(write_table(tmp_path / "t.csv"), "top1")
    assert table["slow"] == [TablePoint(4, 0.80, 0.5), TablePoint(8, 0.90, 1.0)]
    assert [p.epochs for p in table["fast"]] == [4, 8, 16]


def test_prediction_interpolates_between_points_and_marks_extrapolation():
    points = [TablePoint(4, 0.70, 0.5), TablePoint(8, 0.85, 1.0), TablePoint(16, 0.89, 2.0)]
    assert predict(points, 6).quality == pytest.approx(0.70 + 0.5 * 0.15) and not predict(points, 6).extrapolated
    assert predict(points, 12).quality == pytest.approx(0.85 + 0.5 * 0.04)
    assert predict(points, 8).quality == pytest.approx(0.85)
    above = predict(points, 40)
    assert above.quality == pytest.approx(0.89) and above.how == "extrapolated above the table"
    below = predict(points, 2)  # along the two shortest points: 0.70 - (0.15 / 4) * 2
    assert below.quality == pytest.approx(0.70 - 0.0375 * 2) and below.how == "extrapolated below the table"
    assert predict(points, 0.01).quality >= 0.0
    assert predict([TablePoint(4, 0.7, 1.0)], 2).quality == 0.7


def plan(table, budget, seconds_per_epoch):
    candidates = []
    for recipe, per_epoch in seconds_per_epoch.items():
        candidate = Candidate(recipe)
        plan_candidate(candidate, table[recipe], Profile(per_epoch / 10, 10), budget)
        candidates.append(candidate)
    return candidates


def test_the_choice_follows_the_budget(tmp_path):
    table = read_table(write_table(tmp_path / "t.csv"), "top1")
    speeds = {"slow": 10.0, "fast": 2.5}  # seconds per epoch here
    # 60 s: slow affords 6 epochs (0.85), fast 24 (above its table: held at 0.89) -> fast
    candidates = plan(table, 60.0, speeds)
    slow, fast = candidates
    assert slow.affordable_epochs == pytest.approx(6) and slow.predicted_quality == pytest.approx(0.85)
    assert slow.scale_schedule_ratio == pytest.approx(0.75)  # 6 epochs of a recipe that is 8 at ratio 1
    assert fast.affordable_epochs == pytest.approx(24) and fast.prediction == "extrapolated above the table"
    assert best_candidate(candidates).recipe == "fast"
    # 80 s: slow affords 8 epochs (0.90 measured) and beats fast's 0.89 -> slow
    assert best_candidate(plan(table, 80.0, speeds)).recipe == "slow"
    # 20 s: slow 2 epochs (extrapolated: 0.70), fast 8 epochs (0.85) -> fast
    assert best_candidate(plan(table, 20.0, speeds)).recipe == "fast"


def test_ties_prefer_an_interpolated_prediction_then_the_cheaper_epoch():
    measured = Candidate("measured", 5.0, 8, 1.0, 0.9, "interpolated")
    guessed = Candidate("guessed", 1.0, 40, 5.0, 0.9, "extrapolated above the table")
    assert best_candidate([guessed, measured]).recipe == "measured"
    cheap = Candidate("cheap", 1.0, 8, 1.0, 0.9, "interpolated")
    assert best_candidate([measured, cheap]).recipe == "cheap"
    failed = Candidate("failed", error="out of memory")
    assert best_candidate([failed, measured]).recipe == "measured"
    with pytest.raises(ConfigError, match="could not time any candidate here: failed: out of memory"):
        best_candidate([failed])


def test_the_published_table_reads_and_names_its_sources():
    path = PUBLISHED_TABLES[("resnet50", 1000)]
    table = read_table(path, "top1")
    assert {"baseline", "mild", "medium", "hot"} <= set(table)
    assert table["mild"][0] == TablePoint(28, 0.7619, 0.32)
    rows = list(csv.DictReader(path.open()))
    assert all(row["source"] for row in rows)
    assert all(int(90 * float(row["budget"])) == float(row["epochs_mean"]) for row in rows)  # ratios of 90 epochs


def busy(seconds):
    """Real work for ``seconds`` of wall time (not a sleep: a timing that could be mis-measured)."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        total += sum(range(100))
    return total


def test_o1_keeps_the_fastest_setting_and_refuses_a_deliberately_slow_one():
    costs = {"precision": {"fp32": 0.02, "bf16": 0.01}, "compile": {"false": 0.0, "true": 0.03}}

    def measure(settings):
        started = time.perf_counter()
        busy(sum(costs[key][value] for key, value in settings.items()))
        return time.perf_counter() - started

    search = SystemsSearch(
        {"precision": "fp32", "compile": "false"}, {"precision": ["fp32", "bf16"], "compile": ["false", "true"]}
    )
    assert search.run(measure) == {"precision": "bf16"}  # compile=true is the deliberately slow option
    assert [t.settings for t in search.trials] == [
        {"precision": "fp32", "compile": "false"},
        {"precision": "bf16", "compile": "false"},
        {"precision": "bf16", "compile": "true"},
    ]
    assert [t.kept for t in search.trials] == [False, True, False]


def test_o1_keeps_the_given_setting_within_noise_and_skips_failures():
    times = {"fp32": 1.0, "bf16": 1.0 - NOISE / 2, "amp": None}

    def measure(settings):
        if times[settings["precision"]] is None:
            raise ProfileFailed("no fp16 here")
        return times[settings["precision"]]

    search = SystemsSearch({"precision": "fp32"}, {"precision": ["fp32", "amp", "bf16"]})
    assert search.run(measure) == {}  # bf16's gain is within noise: the config as given stays
    assert search.trials[1].error == "no fp16 here" and search.trials[0].kept


def test_o1_tries_the_systems_algorithms_of_the_runs_task():
    image = validate(compose(["data=digits"]), files=False)
    text = validate(compose(["task=masked_lm", "data=stdlib_docs", "model=bert_tiny", "algorithms=[fused_layers]"]))
    (image_start, image_options), (text_start, text_options) = (systems_options(c, 4) for c in (image, text))
    assert image_start["channels_last"] == "false" and "fused_layers" not in image_options
    assert text_start["fused_layers"] == "true" and "channels_last" not in text_options
    assert text_options["fused_layers"] == ["false", "true"] and text_options["data.num_workers"] == ["0", "2", "4"]


def test_o1_settings_replace_the_users_own_and_channels_last_joins_the_algorithms():
    overrides = ["precision=fp32", "data=digits", "algorithms=[ema]"]
    applied = apply_settings(overrides, {"precision": "bf16", "channels_last": "true"}, ["ema"])
    assert applied == ["data=digits", "precision=bf16", "algorithms=[ema,channels_last]"]
    assert apply_settings(["x=1"], {"channels_last": "false"}, ["channels_last", "ema"]) == ["x=1", "algorithms=[ema]"]
    both = apply_settings(["x=1"], {"fused_layers": "true", "compile": "false"}, ["unpadding"])
    assert both == ["x=1", "compile=false", "algorithms=[unpadding,fused_layers]"]


class SameSpeed(contextlib.nullcontext):
    """The profiler of recipe=auto as seen from the choice: every candidate 1 s a step, 10 steps an
    epoch, and the overrides each was timed with kept (the real one runs processes: tested above)."""

    def __init__(self) -> None:
        super().__init__(self)
        self.timed: list[list[str]] = []

    def __call__(self, overrides: list[str]) -> Profile:
        self.timed.append(overrides)
        return Profile(seconds_per_step=1.0, batches_per_epoch=10)


def test_recipe_auto_takes_the_task_from_the_tables_recipes_and_picks_the_lower_loss(tmp_path, monkeypatch):
    """GPT recipes set task=causal_lm themselves: the command needs no task=, and the choice follows
    the causal task's rule (the lower validation loss), not top-1's."""
    from rich.console import Console

    import trainrun.choose.recipes as recipes
    from trainrun.config import ConfigSource

    table = tmp_path / "table.csv"
    rows = [("gpt125", 0.5, 1, 6.0), ("gpt125", 1.0, 2, 5.5), ("gpt125_mosaic", 0.5, 1, 6.2)]
    rows.append(("gpt125_mosaic", 1.0, 2, 5.8))
    table.write_text(
        "recipe,budget,epochs_mean,eval_loss_mean\n" + "".join(f"{r},{b},{e},{q}\n" for r, b, e, q in rows)
    )
    command = ["data=stdlib_stream", "model=gpt_tiny", "data.text.max_seq_len=64", "max_duration=20s"]
    command += [f"auto.table={table}", "recipe=auto"]
    with pytest.raises(ConfigError, match="task.name"):  # the command alone composes the image task
        validate(compose([o for o in command if o != "recipe=auto"]))
    profiler = SameSpeed()
    monkeypatch.setattr(recipes, "Profiler", lambda source, steps: profiler)
    run, decision = recipes.choose_recipe(command, ConfigSource(), Console(file=io.StringIO()))
    assert decision["quality_metric"] == "eval_loss" and decision["chosen"] == "gpt125"  # 5.5 beats 5.8 at 2 epochs
    assert [c["predicted_quality"] for c in decision["candidates"]] == [5.5, 5.8]
    assert [timed[-1] for timed in profiler.timed] == ["recipe=gpt125", "recipe=gpt125_mosaic"]
    assert run[-2:] == ["recipe=gpt125", "scale_schedule_ratio=1.0"] and "recipe=auto" not in run


@pytest.mark.slow
def test_recipe_auto_times_the_candidates_picks_by_the_table_and_trains_to_the_budget(tmp_path):
    # named unlike any packaged recipe (a user's own of the same name would be read, with a note)
    # "fast" at its worst (0.85, extrapolated to no epochs) beats "plain" at its best (0.20, held above
    # the table), so the choice does not hang on how many epochs either affords in 4 s on a busy machine
    rows = [("plain", 0.5, 1, 0.10), ("plain", 1.0, 2, 0.20), ("fast", 0.5, 1, 0.90), ("fast", 1.0, 2, 0.95)]
    table = write_table(tmp_path / "table.csv", rows)
    recipes = tmp_path / "recipe"
    recipes.mkdir()
    for name in ("plain", "fast"):
        (recipes / f"{name}.yaml").write_text(f"# @package _global_\nname: {name}\n")
    run_dir = tmp_path / "run"
    result = run_here(  # the candidates' profiles run in their processes
        *TINY,
        "--config-dir",
        str(tmp_path),
        "recipe=auto",
        "max_duration=4s",
        f"auto.table={table}",
        "auto.profile_steps=6",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr
    decision = json.loads((run_dir / "auto.json").read_text())
    assert decision["chosen"] == "fast"  # the same speed here, and a better table
    assert {c["recipe"] for c in decision["candidates"]} == {"plain", "fast"}
    assert all(c["seconds_per_epoch"] > 0 and c["prediction"] for c in decision["candidates"])
    chosen = next(c for c in decision["candidates"] if c["recipe"] == "fast")
    assert chosen["scale_schedule_ratio"] == pytest.approx(chosen["affordable_epochs"] / 2, rel=1e-3)
    config = (run_dir / "config.yaml").read_text()
    assert "name: fast" in config and "max_duration: 4s" in config
    assert f"scale_schedule_ratio: {chosen['scale_schedule_ratio']}" in config
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["budget_seconds"] == 4.0
    assert "recipe=auto" in result.stdout and "chosen" in result.stdout
    assert not list(tmp_path.glob("trainrun-profile-*"))
    report = run_here("report", str(run_dir), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "recipe=auto against the swept frontier" in (run_dir / "report.md").read_text()


@pytest.mark.slow
def test_a_killed_recipe_auto_takes_its_profiling_child_with_it(tmp_path):
    """CI kills only the process it started: SIGKILL to trainrun while it profiles a candidate ends
    the profiling child too (it asked for SIGTERM on its parent's death)."""
    table = write_table(tmp_path / "table.csv", [("plain", 0.5, 1, 0.3), ("plain", 1.0, 2, 0.6)])
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "plain.yaml").write_text("# @package _global_\nname: plain\n")
    arguments = [*TINY, "--config-dir", str(tmp_path), "recipe=auto", "max_duration=1h", f"auto.table={table}"]
    arguments += ["auto.profile_steps=100000", f"hydra.run.dir={tmp_path / 'run'}"]
    parent = subprocess.Popen(
        [sys.executable, "-m", "trainrun", *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    children_file = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    deadline = time.monotonic() + 120
    while not children_file.read_text().split() and time.monotonic() < deadline:
        assert parent.poll() is None, "trainrun ended before it profiled"
        time.sleep(0.2)
    (child,) = map(int, children_file.read_text().split())
    time.sleep(2)  # the child is training now, past its imports
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(child), "the profiling child outlived its parent"


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_a_table_of_another_tasks_recipes_is_named_with_the_task_they_set(tmp_path):
    """A GPT table given to a run of digits: the line names the table and the task its recipes set."""
    from trainrun.choose.recipes import _run_config
    from trainrun.config import ConfigSource

    table = write_table(tmp_path / "gpt.csv", [("gpt125", 0.5, 1, 0.3), ("gpt125", 1.0, 2, 0.6)])
    with pytest.raises(ConfigError) as error:
        _run_config(["data=digits", "max_duration=1h", f"auto.table={table}"], ConfigSource())
    assert str(error.value).startswith(
        f"auto.table '{table}' holds recipes of task causal_lm (gpt125 sets it), not image_classification: "
        "bad value for 'data.name': 'digits'"
    )


@pytest.mark.parametrize("task", ["causal_lm", "masked_lm"])
def test_a_table_of_another_tasks_runs_is_refused_naming_both_tasks(task):
    """The published ResNet-50 table (top-1) given to a language-model run: the line is about the
    table not fitting the task, not about a setting of the image recipe it would pick."""
    table = PUBLISHED_TABLES[("resnet50", 1000)]
    model, data = {"causal_lm": ("gpt_tiny", "stdlib_stream"), "masked_lm": ("bert_tiny", "stdlib_docs")}[task]
    args = ["recipe=auto", f"task={task}", f"model={model}", f"data={data}", "max_duration=30s", f"auto.table={table}"]
    result = run_here(*args)
    metric = {"causal_lm": "eval_loss", "masked_lm": "masked_accuracy"}[task]
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"trainrun: error: bad value for 'auto.table': '{table}' holds runs of task image_classification, and this "
        f"run is task {task} (its quality column {metric}_mean): pass a table of {task} runs ('trainrun report' of "
        "their sweeps)"
    ]
