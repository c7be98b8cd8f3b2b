"""Every ``trainrun`` command in the code blocks of README.md and docs/ is valid as written: a training command
composes and validates (the data files a user would have, ``/data/...``, need not exist here), a
sweep plans and validates its runs, and each flag a subcommand is shown with exists. The runs
themselves are the other test files' business; this file keeps the documents from drifting.

The documents' ``/tmp/...`` paths are the test's own folder's ``tmp/``: what an earlier walk of the
README left in this machine's ``/tmp`` is never read. Where composing a command reads what earlier
documented lines write (a published folder's ``config.json`` gives ``model=llama`` its shape), those
lines run first, as written, in that folder (:data:`WRITTEN_BY_EARLIER_LINES`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
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
TMP = re.compile(r"(?<![\w./-])/tmp/")
# A path documented commands read when they compose, and the earlier documented lines that write it
# (each found by a piece of its text), in order; ``SMALLER`` shrinks what they make, nothing else.
WRITTEN_BY_EARLIER_LINES = {
    "/tmp/tiny_llama": (
        "bench/make_corpus.py /tmp/corpus ",
        "trainrun write-text /tmp/corpus/corpus.parquet /tmp/tokens ",
        "save_pretrained('/tmp/tiny_llama')",
    ),
}
SMALLER = {"--mb 20": "--mb 0.2"}


def documented_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, arguments after ``trainrun``) of each command in the fenced code blocks: continued
    lines joined, comments dropped, here-documents' bodies skipped."""
    return [
        (number, shlex.split(line, comments=True)[1:])
        for number, line in documented_lines(text)
        if line.split(" ", 1)[0] == "trainrun"
    ]


def documented_lines(text: str) -> list[tuple[int, str]]:
    """(line, text) of each shell line in the fenced code blocks, continued lines joined,
    here-documents' bodies skipped."""
    lines, inside, pending, heredoc_end = [], False, "", None
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
        lines.append((number, line))
    return lines


def here_document(name: str) -> str:
    """The body of the documents' here-document that writes ``name``."""
    for document in DOCUMENTS:
        if match := re.search(
            rf"cat > {re.escape(name)} <<'(\w+)'\n(.*?)\n\1\n", document.read_text("utf-8"), re.DOTALL
        ):
            return match.group(2) + "\n"
    raise AssertionError(f"no document writes {name}")


COMMANDS = [
    (f"{document.relative_to(ROOT)}:{line}", argv)
    for document in DOCUMENTS
    for line, argv in documented_commands(document.read_text(encoding="utf-8"))
]


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A user's checkout of trainrun (its ``scripts/``) after following the README: ``myconf/``
    holds the recipe it writes and a primary config as it describes one (``defaults: [config, _self_]``),
    ``nets.py`` the module of their own that docs/models.md writes."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    recipe = tmp_path / "myconf" / "recipe" / "quick.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(here_document("myconf/recipe/quick.yaml"))
    (tmp_path / "myconf" / "myrun.yaml").write_text("defaults: [config, _self_]\nmax_duration: 2ep\n")
    (tmp_path / "nets.py").write_text(here_document("nets.py"))  # docs/models.md's module of the user's own
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def in_folder(word: str, folder: Path) -> str:
    """``word`` with the documents' ``/tmp/`` as ``folder``'s ``tmp/``."""
    return TMP.sub(f"{folder}/tmp/", word)


def write_earlier_outputs(argv: list[str], folder: Path) -> None:
    """Run, in ``folder``, the documented lines that write what ``argv`` reads when it composes."""
    lines = [line for document in DOCUMENTS for _, line in documented_lines(document.read_text("utf-8"))]
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for path, writers in WRITTEN_BY_EARLIER_LINES.items():
        if not any(path in word for word in argv):
            continue
        for piece in writers:
            (line,) = [line for line in lines if piece in line]  # the documents still show it, once
            for large, small in SMALLER.items():
                line = line.replace(large, small)
            line = in_folder(line, folder).replace(".venv/bin/python", sys.executable)
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=environment, capture_output=True, text=True)
            assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"


def test_the_documents_show_commands_of_every_kind():
    shown = {argv[0] if argv and argv[0] in SUBCOMMANDS else "train" for _, argv in COMMANDS}
    assert shown == {"train", *SUBCOMMANDS} and len(COMMANDS) >= 40


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_is_valid_as_written(where, argv, user_folder, capsys):
    write_earlier_outputs(argv, user_folder)
    argv = [in_folder(word, user_folder) for word in argv if not PLACEHOLDER.fullmatch(word)]
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


LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)")


def test_the_readme_is_a_front_page_whose_manual_pages_exist():
    """README stays a front page (under 300 lines); every page it or a page links to is there."""
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300
    for document in DOCUMENTS:
        for target in LINK.findall(document.read_text(encoding="utf-8")):
            assert (document.parent / target).is_file(), f"{document.relative_to(ROOT)} links to a missing {target}"


CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+\1", re.DOTALL)
SENTENCE_END = re.compile(r"[.!?:][)*_`\"']*$")


def rendering_faults(text: str) -> list[str]:
    """What would not render as written, as a Markdown parser reads ``text``: a code fence left open
    or empty (commands shown as plain text between two empty blocks), a paragraph that stops
    mid-sentence, brackets left open in a paragraph, list item, heading or table cell."""
    from markdown_it import MarkdownIt

    lines, faults = text.splitlines(), []
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    for index, token in enumerate(tokens):
        where = f"line {token.map[0] + 1}" if token.map else "?"
        if token.type == "fence":
            if not token.content.strip():
                faults.append(f"{where}: an empty code block")
            if not lines[token.map[1] - 1].strip().startswith(token.markup) or token.map[1] - token.map[0] < 2:
                faults.append(f"{where}: a code block never closed")
        if token.type != "inline":
            continue
        words = CODE_SPAN.sub("code", token.content)
        for opening, closing in ("()", "[]"):
            if words.count(opening) != words.count(closing):
                faults.append(f"{where}: '{opening}' and '{closing}' do not pair: {token.content[-60:]!r}")
        top_paragraph = tokens[index - 1].type == "paragraph_open" and tokens[index - 1].level == 0
        picture_alone = token.content.startswith("![") and token.content.endswith(")")
        if top_paragraph and not picture_alone and not SENTENCE_END.search(token.content.rstrip()):
            faults.append(f"{where}: a paragraph stops mid-sentence: {token.content[-60:]!r}")
    return faults


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(document.relative_to(ROOT)) for document in DOCUMENTS])
def test_a_document_renders_as_written(document):
    assert rendering_faults(document.read_text(encoding="utf-8")) == []


def test_the_rendering_check_finds_an_empty_fence_a_cut_sentence_and_an_open_block():
    broken = "## Running\n\n```\n```\ntrainrun --help\n```\n```\n\nFlags: a list (`--algorithms a b` is\n"
    faults = rendering_faults(broken)
    assert any("empty code block" in fault for fault in faults)
    assert any("mid-sentence" in fault for fault in faults) and any("do not pair" in fault for fault in faults)
    assert any("never closed" in fault for fault in rendering_faults("Text.\n\n```\ntrainrun\n"))
    assert rendering_faults("Text (with `a (code` span).\n\n```\ntrainrun\n```\n") == []


def test_the_cli_reference_is_what_the_code_generates():
    """docs/cli.md is scripts/cli_reference.py's output for this checkout (rewrite it with --write)."""
    result = subprocess.run(
        [sys.executable, "scripts/cli_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
