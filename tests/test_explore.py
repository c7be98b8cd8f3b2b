"""``trainrun explore``: the page's data, its bad input, its server, and the page itself driven in
Debian's chromium (headless, through playwright): what it draws, its filters, and a target's
readout against ``trainrun report``'s tables."""

from __future__ import annotations

import asyncio
import http.client
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from conftest import run_here

from trainrun.quality import Quality
from trainrun.report import curves
from trainrun.report.explorer import page_data, published_runs, recipe_methods, series_of
from trainrun.report.runs import find_runs, load_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from explorer import browser_page, drawn_runs, open_page, timed_change, write_run  # noqa: E402

LOSS = Quality("eval_loss", "validation loss", higher_is_better=False, percent=False)
# (quality, seconds) for seeds 0 and 1 at each budget
BASELINE = {0.25: ((0.70, 10.0), (0.72, 11.0)), 0.5: ((0.86, 20.0), (0.88, 21.0)), 1.0: ((0.93, 40.0), (0.95, 42.0))}
FAST = {0.25: ((0.80, 6.0), (0.82, 6.5)), 0.5: ((0.90, 12.0), (0.92, 12.5)), 1.0: ((0.955, 24.0), (0.965, 25.0))}
RUNS = 2 * 3 * 2 + 2  # two recipes at three budgets and two seeds, two language-model runs


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("explore")
    for label, table, methods in (("baseline", BASELINE, ()), ("fast", FAST, ("blurpool", "ema"))):
        for budget, seeds in table.items():
            for seed, (quality, seconds) in enumerate(seeds):
                folder = root / label / f"ssr{budget}-seed{seed}"
                write_run(folder, label, budget, seed, quality, seconds, methods=methods, targets=[0.9, 0.95])
    for budget, loss in ((0.5, 3.9), (1.0, 3.4)):
        write_run(root / "gpt" / f"ssr{budget}", "gpt125", budget, 0, loss, 300 * budget, task="causal_lm",
                  model="gpt", data="stdlib_docs", rule=LOSS, targets=[3.5])  # fmt: skip
    failed = write_run(root / "fast" / "broken", "fast", 2.0, 0, 0.1, 1.0, status="failed")
    assert failed.is_dir()
    return root


def test_runs_become_series_with_the_reports_seed_means_and_frontiers(sweep):
    runs = [load_run(path)[0] for path in find_runs([sweep])]
    drawn = [(run, series_of(run)) for run in runs if run.status == "completed"]
    data = page_data(drawn, "baseline", [])
    series = data["series"]
    assert series["label"] == ["baseline", "fast", "gpt125"] and series["task"][2] == "causal_lm"
    assert series["methods"] == [[], ["blurpool", "ema"], []]
    assert len(data["runs"]["series"]) == RUNS and set(map(len, data["runs"].values())) == {RUNS}
    assert data["targets"] == {"image_classification": [0.9, 0.95], "causal_lm": [3.5]}
    rules = [data["rules"][index] for index in series["rule"]]
    assert [rule["higher_is_better"] for rule in rules] == [True, True, False]
    assert rules[2]["direction"] == "lower is better"
    fast = curves.points(run for run, one in drawn if one.label == "fast")
    columns = data["points"]
    mine = [i for i, s in enumerate(columns["series"]) if s == 1]
    assert [columns["quality"][i] for i in mine] == [p.quality for p in fast]
    assert [columns["quality_sd"][i] for i in mine] == [p.quality_spread for p in fast]
    for axis, measure in (("time", curves.seconds), ("cost", curves.cost)):
        frontier = [columns["seconds"][i] for i in data["frontiers"][axis][1]]
        assert frontier == [p.seconds for p in curves.pareto(fast, measure)]
    folder = data["strings"][data["runs"]["folder"][0]]
    assert folder == str(sweep / "baseline" / "ssr0.25-seed0")
    assert data["strings"][data["runs"]["command"][0]].startswith("trainrun recipe=baseline scale_schedule_ratio=0.25")


def test_published_points_keep_their_sources_and_their_recipes_methods():
    published, notes = published_runs()
    assert {run.label for run, _ in published} == {"baseline", "mild", "hot"}
    hot = [(run, series) for run, series in published if run.label == "hot"]
    assert len(hot) == 3 and len({series for _, series in hot}) == 1  # one series, three points
    assert {"sam", "mixup", "colout"} <= set(hot[0][1].methods) and hot[0][1].published
    assert hot[0][1].methods == recipe_methods("hot") and recipe_methods("baseline") == ()
    assert all("Mosaic" in run.summary["published_source"] for run, _ in hot)
    assert hot[0][0].cost == pytest.approx(hot[0][0].train_seconds / 3600 * 32.77)
    assert len(notes) == 3 and all("no time published" in note for note in notes)


# The published facts the page draws, as the sources state them (recipe, epochs): top-1 in %, minutes.
PUBLISHED_FACTS = {
    ("baseline", 90): (76.6, 180),  # the deep dive: NVIDIA Hparams Baseline, 76.6 % in 180 min
    ("mild", 32): (76.6, 27),  # Composer's AWS tutorial: about 27 min on 8 x A100
    ("hot", 180): (79.86, 254),  # the deep dive, Table 7: SAM every 5 steps
    ("hot", 450): (80.78, 573),  # Tables 6-7
    ("hot", 810): (81.03, 980),  # Table 6
}


def test_the_pages_published_points_are_the_sources_minutes_and_top1_by_value():
    """A published point on the page is its source's minutes (in seconds) and top-1 (a fraction the page
    shows as %): a minute read as a second, or a top-1 scaled twice, is caught here."""
    published, notes = published_runs()
    data = page_data(published, None, notes)
    runs, strings = data["runs"], data["strings"]
    (rule,) = data["rules"]
    assert rule["percent"] and rule["higher_is_better"]
    drawn = {}
    for index, series in enumerate(runs["series"]):
        label = data["series"]["label"][series]
        budget = float(strings[runs["budget"][index]])
        (run,) = [run for run, _ in published if run.label == label and run.budget == budget]
        drawn[(label, round(run.epochs))] = (100 * runs["quality"][index], runs["seconds"][index] / 60)
    assert drawn.keys() == PUBLISHED_FACTS.keys()
    for key, (top1, minutes) in PUBLISHED_FACTS.items():
        assert drawn[key] == (pytest.approx(top1), pytest.approx(minutes)), key


def _one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainrun: error:") and message in lines[0], result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{empty}"], "'{empty}' is not a run: no summary.json in it or under it"),
        (["{run}", "{empty}"], "'{empty}' is not a run"),
        (["{run}", "--out", "{run}/config.yaml/page.html"], "config.yaml' is a file"),
        (["{run}", "--out", "{run}"], "is a folder; name the file to write"),
        (["{run}", "--baseline", "nope"], "bad value for '--baseline': 'nope' (recipes: baseline)"),
        (["{run}", "--hardware", "abacus"], "unknown option 'abacus' for 'hardware'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path):
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "run", "baseline", 1.0, 0, 0.9, 10.0)
    names = {"{empty}": str(tmp_path / "empty"), "{run}": str(tmp_path / "run")}
    result = run_here("explore", *[re.sub("{empty}|{run}", lambda m: names[m[0]], a) for a in args])
    _one_line_error(result, re.sub("{empty}|{run}", lambda m: names[m[0]], message))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml", "summary.json"]


def test_a_taken_port_is_one_line(tmp_path):
    write_run(tmp_path / "run", "baseline", 1.0, 0, 0.9, 10.0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_here("explore", str(tmp_path / "run"), "--serve", str(port))
    _one_line_error(result, f"bad value for '--serve': cannot listen on 127.0.0.1:{port}")


@pytest.mark.slow
def test_the_server_answers_the_page_at_slash_on_localhost_and_nothing_else(sweep):
    command = [sys.executable, "-m", "trainrun", "explore", str(sweep), "--serve", "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [server.stdout.readline() for _ in range(2)]
        host, port = re.search(r"serving http://([\d.]+):(\d+)/", lines[1]).groups()
        assert host == "127.0.0.1" and not (sweep / "explorer.html").exists()  # served, not written
        answers = {}
        for path in ("/", "/?x=1", "/explorer.html", "/../baseline/ssr1.0-seed0/config.yaml", "/baseline/", "/%2e%2e/"):
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.request("GET", path)
            response = connection.getresponse()
            answers[path] = (response.status, response.read())
            connection.close()
        assert answers["/"][0] == 200 and b"trainrun Explorer" in answers["/"][1] and answers["/?x=1"][0] == 200
        assert all(status == 404 for path, (status, _) in answers.items() if not path.startswith("/?") and path != "/")
        for _ in range(3):  # a browser that cancels the load mid-page (a reload): its connection reset
            _cancelled_load(host, int(port))
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", "/")
        assert connection.getresponse().status == 200  # still serving
        connection.close()
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    errors = server.stderr.read()
    assert "Traceback" not in errors and "BrokenPipe" not in errors and "ConnectionReset" not in errors, errors


def _cancelled_load(host: str, port: int) -> None:
    """Ask for the page, read a little of it, and reset the connection as a browser cancelling the load does."""
    with socket.create_connection((host, port), timeout=30) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.recv(1024)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.2)


def _report_tables(markdown: str) -> dict[str, dict[str, list[str]]]:
    """Each section's rows of report.md by recipe."""
    tables: dict[str, dict[str, list[str]]] = {}
    for section in markdown.split("\n## ")[1:]:
        title, *lines = section.splitlines()
        rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| ") and "---" not in line]
        tables[title] = {row[0]: row[1:] for row in rows[1:]}
    return tables


async def _readout(page) -> dict[str, list[str]]:
    cells = "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    rows = await page.eval_on_selector_all("#readout tbody tr", cells)
    return {row[0]: row[2:] for row in rows}


@pytest.mark.slow
def test_the_page_in_chromium_draws_every_run_filters_and_reads_targets_as_the_report(sweep, tmp_path):
    page_file = tmp_path / "page.html"
    assert run_here("explore", str(sweep), "--out", str(page_file)).returncode == 0
    targets = (0.85, 0.9, 0.95, 0.97)
    dirs, out = [str(sweep / "baseline"), str(sweep / "fast")], tmp_path / "report"
    report = run_here("report", *dirs, "--targets", ",".join(map(str, targets)), "--out", str(out))
    assert report.returncode == 0, report.stderr
    tables = _report_tables((out / "report.md").read_text())
    shot = tmp_path / "page.png"
    errors = asyncio.run(_drive(page_file, targets, tables, shot))
    pixels = matplotlib.image.imread(shot)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50  # drawn, not blank
    assert errors == []


async def _drive(page_file: Path, targets: tuple[float, ...], tables: dict, shot: Path) -> list[str]:
    """What a reader does on the page, each step checked; the errors the page reported."""
    reach, gains = tables["time / cost to accuracy"], tables["speed-up over 'baseline' at each target (time / cost)"]
    async with browser_page() as (page, errors):
        await open_page(page, page_file)
        published = len(published_runs()[0])
        assert await drawn_runs(page) == 12 + published  # the image runs (the failed one left out), the published
        await timed_change(page, lambda: page.uncheck("fieldset[data-filter=origin] input[value=published]"))
        assert await drawn_runs(page) == 12
        for column, target in enumerate(targets):
            await timed_change(page, lambda typed=f"{target * 100:g}": page.fill("#target", typed))
            shown = await _readout(page)
            for label in ("baseline", "fast"):
                expected = reach[label][column].replace("not reached", "not reached / -").split(" / ")
                assert shown[label][:2] == expected, (target, label)
            assert " / ".join(shown["fast"][2:]) == gains["fast"][column], target
        await timed_change(page, lambda: page.select_option("select[data-method=blurpool]", "without"))
        assert await drawn_runs(page) == 6 and list(await _readout(page)) == ["baseline"]
        await timed_change(page, lambda: page.select_option("select[data-method=blurpool]", "any"))
        await timed_change(page, lambda: page.uncheck("fieldset[data-filter=label] input[value=baseline]"))
        assert await drawn_runs(page) == 6 and list(await _readout(page)) == ["fast"]
        point = await page.locator("g.trace.scatter path.point").first.bounding_box()
        await page.mouse.click(point["x"] + point["width"] / 2, point["y"] + point["height"] / 2)
        await page.wait_for_function("document.getElementById('selected').textContent.includes('recipe=fast')")
        await timed_change(page, lambda: page.select_option("#task", "causal_lm"))
        assert await drawn_runs(page) == 2 and "lower is better" in await page.inner_text("#chart")
        assert (await _readout(page))["gpt125"][0] == "270.0 s"  # loss 3.5: 0.8 of the way from 3.9 to 3.4
        values = [19.25, 0.125, 2.5, 0.000455, 9.08e-05, 0.0004545, 9.995, 99.95, 1234567.895, 1 / 3, 2 / 3, 0.0, -0.04]
        values += [x / 7 for x in range(-20, 20)] + [10.0**e * 1.005 for e in range(-6, 7)]
        shown = await page.evaluate("vs => vs.map(v => [fixed(v, 1), fixed(v, 2), generalFormat(v, 3)])", values)
        assert shown == [[f"{v:.1f}", f"{v:.2f}", f"{v:.3g}"] for v in values]  # the page formats as Python
        await page.screenshot(path=str(shot))
    return errors
