"""A quality metric's direction: accuracy higher is better, a loss lower, in every place that
compares qualities (targets, stop_at, best values, frontiers, reaching a quality, recipe=auto,
reports), by numbers on hand-made values."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from test_algorithms_training import ScriptedQuality, run_to_stop_at
from test_report import _run

from trainrun.choose.recipes import Candidate, best_candidate
from trainrun.commands.report import report_command
from trainrun.quality import TOP1, Quality
from trainrun.report import curves
from trainrun.report.sections import best_within

LOSS = Quality("eval_loss", "validation loss", higher_is_better=False, percent=False)
LOSS_SUMMARY = LOSS.as_summary()


def test_each_direction_reaches_ranks_and_shows_its_values():
    assert TOP1.reached(0.75, 0.75) and not TOP1.reached(0.7499, 0.75) and TOP1.reached(0.8, 0.75)
    assert LOSS.reached(3.28, 3.28) and LOSS.reached(3.0, 3.28) and not LOSS.reached(3.2801, 3.28)
    assert TOP1.better(0.8, 0.7) and not TOP1.better(0.7, 0.7) and LOSS.better(3.0, 3.1) and not LOSS.better(3.1, 3.0)
    assert TOP1.best([0.5, 0.9, 0.7]) == 0.9 and LOSS.best([3.5, 3.1, 3.3]) == 3.1 and LOSS.best([]) is None
    assert sorted([3.5, 3.1, 3.3], key=LOSS.key, reverse=True) == [3.1, 3.3, 3.5]
    assert (TOP1.format(0.7654), LOSS.format(3.28), LOSS.format(None)) == ("76.54%", "3.2800", "-")
    assert (TOP1.format(-0.004, signed=True), LOSS.format(0.02, signed=True)) == ("-0.40%", "+0.0200")
    assert (TOP1.direction, LOSS.direction) == ("higher is better", "lower is better")
    assert Quality.from_summary(LOSS_SUMMARY) == LOSS
    assert Quality.from_summary({}) == TOP1  # a run from before the direction was recorded


class ScriptedLoss(ScriptedQuality):
    """Reports the next of ``values`` as a loss that is the quality (lower is better)."""

    quality, metrics = "eval_loss", {"eval_loss": "validation loss"}
    quality_rule = LOSS

    def evaluator(self, state):
        value = next(self.values)
        return type("E", (), {"update": lambda *a: None, "compute": lambda self: {"eval_loss": value}})()


@pytest.mark.parametrize(("second", "stops_at"), [(3.28, 2), (3.2801, 3)])
def test_stop_at_a_loss_ends_at_the_first_evaluation_at_or_below_it(second, stops_at):
    state = run_to_stop_at(ScriptedLoss([3.9, second, 3.2, 3.1, 3.0]), 3.28)
    assert (state.batch, state.stop_reason) == (stops_at, "target_reached")
    stopped_at = [3.9, second, 3.2][stops_at - 1]
    assert state.notices[-1]["text"] == f"validation loss {stopped_at:.4f} reached stop_at=3.28: training stops here"


def loss_run(label, budget, loss, seconds):
    return dataclasses.replace(_run(label, budget, loss, seconds), summary=LOSS_SUMMARY)


def test_a_loss_frontier_keeps_the_points_no_cheaper_one_has_a_lower_loss_below():
    curve = curves.points(
        [
            loss_run("a", 0.25, 4.0, 10),
            loss_run("a", 0.5, 3.6, 20),
            loss_run("a", 0.75, 3.8, 30),
            loss_run("a", 1, 3.2, 40),
        ]
    )
    assert [p.budget for p in curves.pareto(curve, curves.seconds)] == [0.25, 0.5, 1.0]  # 0.75 is dominated
    assert curves.reach(curve, 3.8, curves.seconds) == curves.Reach(pytest.approx(15.0), at_most=False)
    assert curves.reach(curve, 3.4, curves.seconds) == curves.Reach(pytest.approx(30.0), at_most=False)
    assert curves.reach(curve, 4.5, curves.seconds) == curves.Reach(10.0, at_most=True)
    assert curves.reach(curve, 3.1, curves.seconds) is None
    assert best_within(curve, 35).quality == 3.6 and best_within(curve, 40).quality == 3.2


def test_recipe_auto_picks_the_lowest_predicted_loss():
    candidates = [
        Candidate("a", 1.0, 2.0, 1.0, 3.4, "interpolated"),
        Candidate("b", 1.0, 2.0, 1.0, 3.3, "interpolated"),
    ]
    assert best_candidate(candidates, LOSS).recipe == "b"
    assert best_candidate(candidates).recipe == "a"  # as top-1 the higher number would win


def test_a_report_of_loss_runs_shows_losses_and_lower_is_better(tmp_path, capsys):
    for index, (budget, loss, seconds) in enumerate([(0.5, 3.6, 20.0), (1.0, 3.2, 40.0)]):
        directory = tmp_path / f"run{index}"
        directory.mkdir()
        config = {"name": "gpt", "scale_schedule_ratio": budget, "seed": 0, "quality_targets": [3.4]}
        (directory / "config.yaml").write_text(yaml.safe_dump(config))
        summary = {"status": "completed", "final_eval_loss": loss, "train_seconds": seconds, **LOSS_SUMMARY}
        (directory / "summary.json").write_text(json.dumps(summary))
    assert report_command([str(tmp_path)]) == 0
    report = Path(tmp_path / "report.md").read_text()
    assert "validation loss (mean ± sd, range; lower is better)" in report
    assert "3.6000 ± 0.0000" in report and "3.2000" in report and "%" not in report.split("## runs")[-1]
    assert "| validation loss 3.4000 |" in report and "| 30.0 s" in report  # reached between the two budgets


def test_time_to_a_loss_target_is_the_first_evaluation_at_or_below_it(tmp_path):
    from trainrun.loggers.time_to_quality import TimeToQualityLogger

    log = TimeToQualityLogger(tmp_path, ScriptedLoss([]), [3.3, 3.5, 3.0])
    assert log.targets == [3.5, 3.3, 3.0]  # the easiest first
    for batch, loss in enumerate([3.9, 3.5, 3.4, 3.3], 1):
        log.records.append(
            {
                "eval_loss": loss,
                "train_seconds": 10.0 * batch,
                "wall_seconds": 11.0 * batch,
                "epoch": batch / 4,
                "batch": batch,
                "samples": 8 * batch,
            }
        )
    reached = log.time_to_targets()
    assert (reached["3.5"]["batch"], reached["3.3"]["batch"], reached["3"]) == (2, 4, None)
