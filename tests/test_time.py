import pytest

from trainrun.core.time import Time, Timeline, TimeUnit, budget_size


@pytest.mark.parametrize("text", ["90ep", "100ba", "3000sp", "0.5dur", "1dur", "0ba"])
def test_time_strings_round_trip(text):
    assert str(Time.parse(text)) == text
    assert Time.parse(str(Time.parse(text))) == Time.parse(text)


@pytest.mark.parametrize("text", ["", "ep", "10", "1.5ep", "10 epochs", "-3ba", "3xx", "dur"])
def test_bad_time_strings_name_the_text(text):
    with pytest.raises(ValueError, match="is not a time"):
        Time.parse(text)


def test_units_convert_to_batches():
    timeline = Timeline.for_run(Time.parse("10ep"), batches_per_epoch=20, samples_per_batch=64)
    assert timeline.max_batches == 200
    assert timeline.to_batches("2ep") == 40
    assert timeline.to_batches("7ba") == 7
    assert timeline.to_batches("640sp") == 10
    assert timeline.to_batches("641sp") == 11
    assert timeline.to_batches("0.25dur") == 50


def test_max_duration_cannot_be_a_fraction_of_itself():
    with pytest.raises(ValueError):
        Timeline.for_run(Time.parse("0.5dur"), 10, 10)


def test_scaling_truncates_whole_units_like_the_published_recipes():
    assert Time.parse("90ep").scaled(0.32) == Time(28, TimeUnit.EPOCH)
    assert Time.parse("90ep").scaled(0.36) == Time(32, TimeUnit.EPOCH)
    assert Time.parse("0.5dur").scaled(0.1) == Time.parse("0.5dur")
    assert Time.parse("1ep").scaled(0.1) == Time(1, TimeUnit.EPOCH)


def test_interval_boundaries_include_the_last_step():
    timeline = Timeline(batches_per_epoch=10, samples_per_batch=1, max_batches=25)
    hits = [b for b in range(1, 26) if timeline.ends_interval(b, timeline.to_batches("1ep"))]
    assert hits == [10, 20, 25]
    assert [b for b in range(1, 26) if timeline.ends_interval(b, 1)] == list(range(1, 26))  # every step
    assert [b for b in range(1, 26) if timeline.ends_interval(b, 0)] == [25]  # 0: only the run's end


def test_a_budget_is_not_an_amount_of_training():
    timeline = Timeline(batches_per_epoch=10, samples_per_batch=1, max_batches=25)
    with pytest.raises(ValueError, match=r"^'30s' is a budget, not an amount of training$"):
        timeline.to_batches("30s")


def test_timeline_edges_zero_times_one_step_runs_sample_budgets_and_their_errors():
    """Edges the run's own tests never reach: a zero time stays zero when stretched, a run shorter
    than a step is one step (not two), samples convert in budgeted runs too, money is sized in
    dollars, and the two wrong max_durations say what is wrong."""
    assert Time.parse("0ba").scaled(3.0) == Time(0, TimeUnit.BATCH)
    assert Time.parse("1sp").scaled(0.5) == Time(1, TimeUnit.SAMPLE)  # truncated, never below 1
    assert Timeline.for_run(Time.parse("1ba"), 10, 8).max_batches == 1
    assert Timeline.for_run(Time.parse("3sp"), 10, 8).max_batches == 1  # under a batch: one step
    assert Timeline.for_run(Time.parse("64sp"), 10, 8).max_batches == 8
    assert Timeline.for_budget(10, 8).to_batches(Time.parse("16sp")) == 2
    assert budget_size("50usd") == 50.0 and budget_size("2min") == 120.0
    with pytest.raises(ValueError, match=r"^max_duration cannot be written in 'dur'$"):
        Timeline.for_run(Time.parse("0.5dur"), 10, 8)
    with pytest.raises(ValueError, match=r"^a budget's timeline is planned as the run goes: use Timeline\.for_budget$"):
        Timeline.for_run(Time.parse("30s"), 10, 8)


def test_the_scale_schedule_ratio_stretches_schedule_times_and_a_fixed_run_but_never_a_budget():
    assert Timeline(10, 8, 100).stretched_batches("10ba") == 10  # no ratio: as written
    plain = Timeline.for_run(Time.parse("2ep"), 10, 8)
    assert plain.stretch == 1.0 and plain.max_batches == 20
    stretched = Timeline.for_run(Time.parse("2ep"), 10, 8, stretch=1.5)
    assert stretched.max_batches == 30 and stretched.stretched_batches("4ba") == 6
    assert stretched.stretched_batches("1ep") == 15 and stretched.stretched_batches("0.5dur") == 15
    budget = Timeline.for_budget(10, 8, stretch=0.5)
    assert budget.stretched_batches("10ba") == 5 and Timeline.for_budget(10, 8).stretched_batches("10ba") == 10
