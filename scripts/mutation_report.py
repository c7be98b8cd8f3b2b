"""The mutation score of the last ``mutmut run``, per module, and every surviving mutant's diff.

Reads mutmut's results (``mutants/**/*.py.meta``) in the repository root and the mutants accepted
as equivalent (``tests/equivalent_mutants.txt``: a mutant's name, then why it cannot change what
the code does). A mutant counts as caught when a test failed or timed out on it; the score is
caught / (mutants − accepted equivalents): a mutant no test reaches counts against it. Markdown
on standard output; ``make mutation`` writes it to ``mutation-report.md``.

    .venv/bin/python scripts/mutation_report.py [--no-diffs]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACCEPTED = ROOT / "tests" / "equivalent_mutants.txt"
CAUGHT = ("killed", "timeout")


def accepted_equivalents() -> dict[str, str]:
    """Mutant name -> why it is equivalent, from :data:`ACCEPTED` (``#`` starts a comment line)."""
    reasons = {}
    for line in ACCEPTED.read_text().splitlines() if ACCEPTED.is_file() else []:
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            reasons[name] = why.strip()
    return reasons


def statuses() -> dict[str, dict[str, str]]:
    """Module path -> {mutant name: status} of every mutant mutmut has results for."""
    from mutmut.stats import status_by_exit_code

    results = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(ROOT / "mutants")).removesuffix(".meta")
        exit_codes = json.loads(meta.read_text())["exit_code_by_key"]
        if exit_codes:
            results[module] = {name: status_by_exit_code[code] for name, code in exit_codes.items()}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-diffs", action="store_true", help="list surviving mutants without their diffs")
    args = parser.parse_args()
    results, equivalent = statuses(), accepted_equivalents()
    if not results:
        print("no mutation results: run 'make mutation' (mutmut run) first", file=sys.stderr)
        return 2
    print("| module | mutants | caught | survived | not run | accepted equivalent | score |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    totals: Counter = Counter()
    survivors = []
    for module, by_name in results.items():
        counts = Counter("caught" if status in CAUGHT else status for status in by_name.values())
        accepted = sum(1 for name, status in by_name.items() if name in equivalent and status not in CAUGHT)
        survived = counts["survived"] - accepted
        not_run = len(by_name) - counts["caught"] - counts["survived"]
        scored = len(by_name) - accepted
        totals.update(mutants=len(by_name), caught=counts["caught"], survived=survived, not_run=not_run)
        totals.update(accepted=accepted, scored=scored)
        score = f"{counts['caught'] / scored:.1%}" if scored else "–"
        print(f"| {module} | {len(by_name)} | {counts['caught']} | {survived} | {not_run} | {accepted} | {score} |")
        survivors += [name for name, status in by_name.items() if status == "survived" and name not in equivalent]
    score = f"{totals['caught'] / totals['scored']:.1%}" if totals["scored"] else "–"
    print(
        f"| **all** | {totals['mutants']} | {totals['caught']} | {totals['survived']} | {totals['not_run']} "
        f"| {totals['accepted']} | **{score}** |"
    )
    print("\n'not run': no selected test reaches the mutated function (counted as not caught).")
    print(f"\n## Surviving mutants ({len(survivors)})\n")
    for name in survivors:
        if args.no_diffs:
            print(f"- `{name}`")
            continue
        diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], capture_output=True, text=True, cwd=ROOT)
        print(f"```diff\n{diff.stdout.strip()}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
