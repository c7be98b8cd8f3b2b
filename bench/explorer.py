"""The Explorer at its scale: a page of ``--runs`` (5,000) runs opens and re-draws after each change
in under ``--limit`` (2 s) in a real browser (Debian's chromium, headless, through playwright).

Writes the run folders under OUT as a sweep leaves them (``config.yaml`` and ``summary.json``: a
recipe's label, budget, seed, methods, machine and price, its quality, time, bottleneck and
command; the qualities follow a saturating curve of the budget, seeds scattered about it: no
training runs), builds the page with ``trainrun explore`` and times, in the browser, the page's
opening (navigation start to the first drawn chart) and each change from the event to the chart
drawn again: a recipe hidden, a method required, time switched for cost, a target typed.

    .venv/bin/python bench/explorer.py OUT [--runs 5000] [--limit 2]
    .venv/bin/python bench/explorer.py --shot PAGE PNG     # the page's picture in docs/tradeoff.md

``--shot`` draws PAGE, a written Explorer page, with the published points hidden and the pointer
on one run, and saves it as PNG.

The folder writer and the browser helpers here are also tests/test_explore.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

# the run markers plotly drew (SVG paths) in the traces of runs, not seed means or frontiers
DRAWN_RUNS = """[...document.querySelectorAll('g.trace.scatter')]
  .filter(g => g.__data__[0].trace.meta && g.__data__[0].trace.meta.kind === 'runs')
  .reduce((n, g) => n + g.querySelectorAll('path.point').length, 0)"""
METHODS = ("blurpool", "channels_last", "ema", "label_smoothing", "progressive_resizing", "mixup", "sam")


def write_run(folder: Path, label: str, budget: float, seed: int, quality: float, seconds: float, **more: Any) -> Path:
    """A finished run's two files, as a sweep writes them; ``more``: methods (names), hardware,
    price, task, model, data, targets, status, rule (its :class:`Quality`, top-1 if not given)."""
    from trainrun.quality import TOP1

    rule = more.get("rule", TOP1)
    folder.mkdir(parents=True, exist_ok=True)
    hardware = more.get("hardware", "cpu_2vcpu_aws")
    config = {
        "name": label,
        "scale_schedule_ratio": budget,
        "seed": seed,
        "quality_targets": list(more.get("targets", [0.9])),
        "task": {"name": more.get("task", "image_classification")},
        "model": {"name": more.get("model", "resnet_small")},
        "data": {"name": more.get("data", "mnist5k")},
        "hardware": {"name": hardware, "price_per_hour": more.get("price", 0.085)},
        "algorithms": {name: {} for name in more.get("methods", ())},
    }
    command = f"trainrun recipe={label} scale_schedule_ratio={budget} seed={seed} hydra.run.dir={folder}"
    summary = {
        **rule.as_summary(),
        "status": more.get("status", "completed"),
        f"final_{rule.metric}": quality,
        "train_seconds": seconds,
        "bottleneck": {
            "bottleneck": "compute",
            "bottleneck_name": "device compute",
            "share": 0.9,
            "compute_seconds": 0.9 * seconds,
            "input_seconds": 0.1 * seconds,
            "host_seconds": 0.0,
            "train_seconds": seconds,
            "speedup_if_rest_free": 1 / 0.9,
            "speedup_if_bottleneck_free": 10.0,
            "clock": "wall clock",
        },
        "provenance": {"command": command},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_runs(out: Path, count: int) -> int:
    """``count`` runs: recipes with different methods, each at budgets 0.1-4 with up to 10 seeds."""
    chance = random.Random(0)
    recipes = [(f"recipe{i}", METHODS[: i % len(METHODS)], 1 + 0.3 * i) for i in range(10)]
    seeds = max(1, min(10, count // (len(recipes) * 10)))
    budgets = math.ceil(count / (len(recipes) * seeds))
    written = 0
    for label, methods, speed in recipes:
        for b in range(budgets):
            budget = round(0.1 + 3.9 * b / max(1, budgets - 1), 4)
            for seed in range(seeds):
                if written == count:
                    return written
                quality = 0.97 - 0.5 * math.exp(-2.5 * budget) + chance.gauss(0, 0.005)
                seconds = 600 * budget / speed * (1 + chance.gauss(0, 0.02))
                folder = out / label / f"ssr{budget}-seed{seed}"
                write_run(folder, label, budget, seed, quality, seconds, methods=methods, targets=[0.9, 0.95])
                written += 1
    return written


def chromium() -> str:
    """Debian's chromium (scripts/setup_env.sh installs it); one line where it is missing."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        sys.exit("chromium is not installed: run scripts/setup_env.sh (Debian's chromium package)")
    return found


@asynccontextmanager
async def browser_page() -> AsyncIterator[tuple[Any, list[str]]]:
    """A headless chromium page and the errors it reports (console errors, uncaught exceptions),
    through playwright's asyncio API (its synchronous API switches greenlets under the caller)."""
    from playwright.async_api import async_playwright

    errors: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1300, "height": 950})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page, errors
        finally:
            await browser.close()


async def open_page(page: Any, path: Path) -> float:
    """Opens the page file; milliseconds from navigation start to its first drawn chart."""
    await page.goto(path.resolve().as_uri())
    await page.wait_for_selector("body[data-renders='1']", timeout=60_000)
    return float(await page.evaluate("document.body.dataset.openMs"))


async def timed_change(page: Any, change: Callable[[], Awaitable[Any]]) -> float:
    """Milliseconds from just before ``change`` (a user's action) to the chart drawn again."""
    renders = int(await page.evaluate("document.body.dataset.renders"))
    started = await page.evaluate("performance.now()")
    await change()
    await page.wait_for_function(f"Number(document.body.dataset.renders) > {renders}", timeout=60_000)
    return await page.evaluate("performance.now()") - started


async def drawn_runs(page: Any) -> int:
    return int(await page.evaluate(DRAWN_RUNS))


async def screenshot(page_file: Path, picture: Path) -> list[str]:
    """The page with the published points hidden and the pointer on its sixth run, as PNG; the
    errors the page reported."""
    async with browser_page() as (page, errors):
        await open_page(page, page_file)
        await timed_change(page, lambda: page.uncheck("fieldset[data-filter=origin] input[value=published]"))
        box = await page.locator("g.trace.scatter path.point").nth(5).bounding_box()
        await page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        await page.wait_for_selector("g.hovertext")
        await page.screenshot(path=str(picture))
    return errors


async def time_changes(page_file: Path) -> tuple[dict[str, float], int, list[str]]:
    """The page's opening and each change, in milliseconds; the runs drawn at opening; its errors."""
    async with browser_page() as (page, errors):
        timings = {"open the page": await open_page(page, page_file)}
        shown = await drawn_runs(page)
        recipe = "fieldset[data-filter=label] input[value=recipe1]"
        timings["hide a recipe"] = await timed_change(page, lambda: page.uncheck(recipe))
        method = "select[data-method=ema]"
        timings["require a method"] = await timed_change(page, lambda: page.select_option(method, "with"))
        timings["time to cost"] = await timed_change(page, lambda: page.select_option("#axis", "cost"))
        timings["type a target"] = await timed_change(page, lambda: page.fill("#target", "93"))
    return timings, shown, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="?", help="where the runs and the page are written")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--limit", type=float, default=2.0, help="seconds each opening or change may take")
    parser.add_argument("--shot", type=Path, nargs=2, metavar=("PAGE", "PNG"), help="only draw PAGE into PNG")
    args = parser.parse_args()
    if args.shot:
        errors = asyncio.run(screenshot(*args.shot))
        if errors:
            print(f"the page reported errors: {errors}")
        return int(bool(errors))
    if args.out is None:
        parser.error("give OUT, or --shot PAGE PNG")
    shutil.rmtree(args.out / "runs", ignore_errors=True)
    count = write_runs(args.out / "runs", args.runs)
    from trainrun.commands import main as trainrun

    started = time.perf_counter()
    if trainrun(["explore", str(args.out / "runs"), "--out", str(args.out / "explorer.html")]) != 0:
        return 1
    built = time.perf_counter() - started
    size = (args.out / "explorer.html").stat().st_size / 2**20
    print(f"{count} runs: trainrun explore built the page in {built:.1f} s ({size:.1f} MiB, plotly.js included)")
    timings, shown, errors = asyncio.run(time_changes(args.out / "explorer.html"))
    print(f"browser: chromium, headless; runs drawn at opening: {shown} (published points too)")
    for what, milliseconds in timings.items():
        print(f"{what:>18}: {milliseconds:7.0f} ms")
    slow = [what for what, milliseconds in timings.items() if milliseconds > args.limit * 1000]
    if errors or slow:
        print(f"over {args.limit:g} s: {', '.join(slow) or 'none'}; page errors: {errors or 'none'}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
