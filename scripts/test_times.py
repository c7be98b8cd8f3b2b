"""Where the suite's time goes: a ``pytest --durations=0`` log summed by file and by marker.

    .venv/bin/python -m pytest -n 2 --durations=0 > suite.log
    .venv/bin/python scripts/test_times.py suite.log

Durations are each test's own seconds (setup, call and teardown; a session fixture's setup counts
for the first test that asks for it). With several workers they add up to more than the wall time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(tests/\S+?)::(\S+)")
MARKERS = ("distributed", "slow")  # each test counted under the first that marks it


def marked(marker: str) -> set[str]:
    """The node ids (file::name) pytest collects under ``-m marker``."""
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return {line.strip() for line in listing.stdout.splitlines() if "::" in line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    args = parser.parse_args()
    seconds: dict[str, float] = defaultdict(float)
    for line in args.log.read_text().splitlines():
        if match := LINE.match(line.strip()):
            seconds[f"{match[3]}::{match[4]}"] += float(match[1])
    total = sum(seconds.values())
    by_file: dict[str, float] = defaultdict(float)
    for test, value in seconds.items():
        by_file[test.split("::")[0]] += value
    print(f"{len(seconds)} tests, {total:.0f} s of test time:\n\n| file | seconds | share |\n| --- | --- | --- |")
    for name, value in sorted(by_file.items(), key=lambda item: -item[1]):
        print(f"| {name} | {value:.0f} | {value / total:.0%} |")
    print("\n| marker | tests | seconds | share |\n| --- | --- | --- | --- |")
    unmarked = set(seconds)
    for marker in MARKERS:
        ids = marked(marker) & unmarked
        unmarked -= ids
        value = sum(seconds[test] for test in ids)
        print(f"| {marker} | {len(ids)} | {value:.0f} | {value / total:.0%} |")
    value = sum(seconds[test] for test in unmarked)
    print(f"| neither | {len(unmarked)} | {value:.0f} | {value / total:.0%} |")


if __name__ == "__main__":
    main()
