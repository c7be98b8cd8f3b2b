"""Every ``trainrun`` command in the code blocks of README.md and docs/ is valid as written: a training command
composes and validates (the data files a user would have, ``/data/...``, need not exist here), a
sweep plans and validates its runs, and each flag a subcommand is shown with exists. The runs
themselves are the other test files' business; this file keeps the documents from drifting."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trainrun.commands import SUBCOMMANDS, main
from trainrun.commands.sweep import parse_folds, parse_sweep_arguments, plan
from trainrun.config import AUTO_RECIPE, NO_RUN_FLAGS, check, locate, translate

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# A word that stands for others the text describes: "..." for the user's data keys (`trainrun
# recipe=mild ... launcher.nnodes=2`), a shell variable for settings given in prose (`$C`).
PLACEHOLDER = re.compile(r"\.\.\.|\$\w+")
HEREDOC = re.compile(r"<<\s*'?(\w+)'?")


def documented_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, arguments after ``trainrun``) of each command in the fenced code blocks: continued
    lines joined, comments dropped, here-documents' bodies skipped."""
    commands, inside, pending, heredoc_end = [], False, "", None
    for number, line in enumerate(text.splitlines(), 1):
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        if match := HEREDOC.search(line):
            heredoc_end = match.group(1)
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.split(" ", 1)[0] == "trainrun":
            commands.append((number, shlex.split(line, comments=True)[1:]))
    return commands


def here_document(text: str, name: str) -> str:
    """The body of the README's here-document that writes ``name``."""
    match = re.search(rf"cat > {re.escape(name)} <<'(\w+)'\n(.*?)\n\1\n", text, re.DOTALL)
    assert match, f"README writes no {name}"
    return match.group(2) + "\n"


COMMANDS = [
    (f"{document.relative_to(ROOT)}:{line}", argv)
    for document in DOCUMENTS
    for line, argv in documented_commands(document.read_text(encoding="utf-8"))
]


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A user's checkout of trainrun (its ``scripts/``) after following the README: ``myconf/``
    holds the recipe it writes and a primary config as it describes one (``defaults: [config, _self_]``)."""
    text = README.read_text(encoding="utf-8")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    recipe = tmp_path / "myconf" / "recipe" / "quick.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(here_document(text, "myconf/recipe/quick.yaml"))
    (tmp_path / "myconf" / "myrun.yaml").write_text("defaults: [config, _self_]\nmax_duration: 2ep\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_documents_show_commands_of_every_kind():
    shown = {argv[0] if argv and argv[0] in SUBCOMMANDS else "train" for _, argv in COMMANDS}
    assert shown == {"train", *SUBCOMMANDS} and len(COMMANDS) >= 40


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_is_valid_as_written(where, argv, user_folder, capsys):
    argv = [word for word in argv if not PLACEHOLDER.fullmatch(word)]
    if argv[:1] and argv[0] in SUBCOMMANDS:
        check_subcommand(argv, capsys)
        return
    hydra_args, overrides, _ = translate(argv)
    source, hydra_args, overrides = locate(hydra_args, overrides)  # the folders and recipe files exist
    if NO_RUN_FLAGS & set(hydra_args) or AUTO_RECIPE in overrides:
        return  # help and --info compose nothing; recipe=auto times its candidates (tests/test_choose.py)
    check(overrides, multirun=bool({"-m", "--multirun"} & set(hydra_args)), files=False, source=source)


def check_subcommand(argv: list[str], capsys) -> None:
    """A sweep plans and validates its first and last runs; any other subcommand knows each flag shown."""
    name, arguments = argv[0], argv[1:]
    if name == "sweep":
        budgets, seeds, out, overrides, source, folds = parse_sweep_arguments(arguments)
        base = check(overrides, files=False, source=source)[0]
        jobs = plan(budgets, seeds, out or Path("sweeps"), overrides, parse_folds(folds, base.data.segmentation.folds))
        for job in (jobs[0], jobs[-1]):
            check(list(job.overrides), files=False, source=source)
        return
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    known = capsys.readouterr().out
    for flag in (word.split("=")[0] for word in arguments if word.startswith("-")):
        assert re.search(rf"{re.escape(flag)}\b", known), f"'trainrun {name}' has no flag {flag}"
