"""Wall-clock budgets: the timeline's re-planning by numbers, the budget's checks on a simulated
clock, and real budgeted runs (end on time, schedules at their end, resume keeps the budget)."""

import json

import pytest
import torch
from conftest import TINY, read_metrics, run_here

from trainrun.algorithms.progressive_resizing import size_at
from trainrun.algorithms.specs.progressive_resizing import ProgressiveResizingConfig
from trainrun.core.accounts import train_seconds
from trainrun.core.budget import WallClockBudget
from trainrun.core.precision import Precision
from trainrun.core.state import State
from trainrun.core.time import Time, Timeline, TimeUnit
from trainrun.errors import ConfigError
from trainrun.optim.schedules import schedule_function
from trainrun.schema import SchedulerConfig


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30min", 1800), ("1.5h", 5400), ("2e1s", 20)])
def test_budget_units_are_seconds(text, seconds):
    budget = Time.parse(text)
    assert budget.unit.is_budget and budget.wall_seconds == seconds
    assert str(Time.parse(str(budget))) == str(budget)
    assert budget.scaled(0.5) == budget  # a budget is what the run may spend: never stretched


def test_money_is_a_budget_and_steps_are_not():
    assert Time.parse("50usd").unit is TimeUnit.DOLLAR and Time.parse("50usd").unit.is_budget
    assert not any(Time.parse(t).unit.is_budget for t in ("1ep", "1ba", "1sp", "0.5dur"))


def test_a_fixed_length_run_is_linear_in_steps():
    timeline = Timeline(batches_per_epoch=10, samples_per_batch=4, max_batches=40)
    assert [timeline.fraction(b) for b in (0, 10, 30, 40, 50)] == [0.0, 0.25, 0.75, 1.0, 1.0]
    assert [timeline.to_batches(f"{x}dur") for x in (0.1, 0.25, 0.5, 0.99, 1.0)] == [4, 10, 20, 40, 40]


def test_replanning_keeps_progress_continuous_and_ends_at_the_new_step():
    timeline = Timeline(10, 4, 100)
    timeline.replan(20, 30)  # 20 % done at step 20; now the run ends at step 50
    assert timeline.knots == [(0, 0.0), (20, 0.2), (50, 1.0)]
    assert timeline.max_batches == 50
    assert timeline.fraction(10) == pytest.approx(0.1)  # the past is as it was
    assert timeline.fraction(35) == pytest.approx(0.2 + 0.8 * 15 / 30)
    assert timeline.to_batches("0.6dur") == 35  # the inverse of fraction: 0.2 + 0.8 * 15/30 = 0.6
    assert timeline.to_batches("0.1dur") == 10
    timeline.replan(40, 0)  # nothing left: the run ends now, at 100 %
    assert timeline.max_batches == 40 and timeline.fraction(40) == 1.0
    assert timeline.fraction(39) == pytest.approx(0.2 + 0.8 * 19 / 30)


def test_timeline_state_round_trips():
    timeline = Timeline(10, 4, 100)
    timeline.replan(20, 30)
    restored = Timeline.for_budget(10, 4)
    restored.load_state_dict(json.loads(json.dumps(timeline.state_dict())))
    assert restored.knots == timeline.knots


class SimulatedAccounts:
    """Training seconds as a test sets them."""

    def __init__(self):
        self.seconds = 0.0

    def train_seconds(self):
        return self.seconds


def simulate(budget_seconds, step_seconds, steps_cap=100_000, world_size=1):
    """Run a budget's checks over steps that take ``step_seconds(step)``; return state and LRs."""
    model = torch.nn.Linear(1, 1)
    timeline = Timeline.for_budget(batches_per_epoch=50, samples_per_batch=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    config = SchedulerConfig(name="cosine", t_warmup="0.1dur", alpha_f=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_function(config, timeline))
    state = State(model, optimizer, timeline, torch.device("cpu"), Precision("fp32", "cpu"), world_size=world_size)
    state.accounts = SimulatedAccounts()
    budget = WallClockBudget(budget_seconds, f"{budget_seconds}s")
    progress = []
    while state.batch < timeline.max_batches and state.batch < steps_cap:
        state.accounts.seconds += step_seconds(state.batch + 1)
        optimizer.step()
        budget.after_step(state, state.batch + 1)
        scheduler.step()
        state.batch += 1
        progress.append(state.progress)
    return state, optimizer.param_groups[0]["lr"], progress


def test_constant_steps_fill_the_budget_exactly():
    state, last_lr, progress = simulate(10.0, lambda step: 2.0 if step == 1 else 0.1)  # step 1 compiles
    assert state.batch == 81  # 2 s + 80 x 0.1 s = 10 s
    assert state.accounts.seconds == pytest.approx(10.0)
    assert progress[-1] == 1.0 and last_lr == pytest.approx(0.0, abs=1e-12)  # cosine at its floor
    assert all(b >= a for a, b in zip(progress, progress[1:]))  # progress never goes back


def test_changing_step_cost_still_ends_within_half_a_step_with_schedules_done():
    # progressive resizing's pattern: cheap steps early, dearer ones after 40 % of the run
    state, last_lr, progress = simulate(30.0, lambda step: 0.02 if step < 300 else 0.08)
    assert abs(state.accounts.seconds - 30.0) <= 0.04 + 1e-9
    assert progress[-1] == 1.0 and last_lr == pytest.approx(0.0, abs=1e-12)
    resizing = ProgressiveResizingConfig(initial_scale=0.5, delay=0.4, finetune=0.2, size_increment=4)
    assert size_at(progress[-1], 176, resizing) == 176  # full resolution at the end
    assert all(b >= a for a, b in zip(progress, progress[1:]))


def test_the_rate_is_the_mean_step_of_the_last_16_steps():
    # 2 s for the first step, 0.1 s up to step 40, then 0.3 s: after step 48 the last 16 steps
    # are 8 of each, 0.2 s a step; 100.05 - (2 + 39 x 0.1 + 8 x 0.3) = 91.75 s left = 458.75 steps
    cost = lambda step: 2.0 if step == 1 else 0.1 if step <= 40 else 0.3  # noqa: E731
    state, _, _ = simulate(100.05, cost, steps_cap=48)
    assert state.batch == 48 and state.timeline.max_batches == 48 + 459
    # (a window of 15 steps would plan 444 more, of 17 steps 473, the last step alone 306)


def test_a_budget_shorter_than_the_first_step_is_refused():
    with pytest.raises(ConfigError, match=r"'max_duration': 0.5s .* is shorter than one training step here"):
        simulate(0.5, lambda step: 1.0)


def longest_step(run_dir):
    """The longest training step of a run, from its steps.jsonl (evaluation and checkpoints excluded)."""
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return max(train_seconds(row) for row in rows)


@pytest.mark.slow
def test_a_budgeted_run_ends_on_time_and_resuming_keeps_the_time_spent(tmp_path):
    run_dir = tmp_path / "run"
    common = [*TINY, "max_duration=6s", "scheduler.alpha_f=0", "scheduler.t_warmup=0.1dur", "checkpoint.interval=1ep"]
    common.append(f"hydra.run.dir={run_dir}")
    result = run_here(*common)
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["batches"] == summary["max_batches"]
    # within 5 %, or within the step during which the budget ran out on a busy machine
    assert abs(summary["train_seconds"] - 6.0) <= max(0.05 * 6.0, longest_step(run_dir))
    assert read_metrics(run_dir)[-1]["lr"] == pytest.approx(0.0, abs=1e-12)
    # the same run given 12 s in all: it continues from the 6 s already spent
    result = run_here(*common, "max_duration=12s", "resume=auto")
    assert result.returncode == 0, result.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["batches"] > summary["batches"]
    assert abs(resumed["train_seconds"] - 12.0) <= max(0.05 * 12.0, longest_step(run_dir))


@pytest.mark.slow
def test_a_budget_shorter_than_one_step_is_one_line(tmp_path):
    result = run_here(*TINY, "max_duration=1e-4s", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is shorter than one training step here" in lines[0], result.stderr


@pytest.mark.slow
def test_two_ranks_end_a_budget_at_the_same_step(tmp_path):
    """Rank 0 plans, every rank follows: had one rank stopped early, the other's next collective
    would fail the run."""
    result = run_here(*TINY, "max_duration=5s", "launcher.devices=2", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["batches"] == summary["max_batches"] > 2
    assert summary["budget_seconds"] == 5.0


def test_a_sweep_takes_ratios_or_budgets_and_names_runs_by_them(tmp_path):
    from trainrun.commands.sweep import _budgets, plan

    assert _budgets("[1.0,0.25,0.5]") == ["0.25", "0.5", "1"]
    assert _budgets("[2min,30s,90s]") == ["30s", "90s", "2min"]  # ordered by seconds
    jobs = plan(["30s", "2min"], [0, 1], tmp_path, ["data=mnist5k"])
    assert [job.run_dir.name for job in jobs] == [
        "budget30s-seed0",
        "budget30s-seed1",
        "budget2min-seed0",
        "budget2min-seed1",
    ]
    assert jobs[0].overrides == ("data=mnist5k", "max_duration=30s", "seed=0")
    assert plan(["0.5"], [None], tmp_path, [])[0].overrides == ("scale_schedule_ratio=0.5",)
    with pytest.raises(ConfigError, match="one kind"):
        _budgets("[30s,1usd]")


def test_a_cost_budget_is_training_time_at_the_hardwares_price_for_every_node():
    from trainrun.config import compose
    from trainrun.schema import budget_seconds
    from trainrun.validation import validate

    two_nodes = ["launcher.nnodes=2", "launcher.master_port=29500", "launcher.master_addr=10.0.0.1"]
    config = validate(compose(["max_duration=50usd", "hardware=1xa100_aws", *two_nodes]), files=False)
    assert budget_seconds(config) == pytest.approx(50 / (4.10 * 2) * 3600)
    assert budget_seconds(validate(compose(["max_duration=1.5h"]), files=False)) == 5400
