"""A file trainrun reads that is damaged or of the wrong kind: one line naming the file (and the
line, for text formats), exit 2, nothing written; one test per kind of file, through the CLI."""

import hashlib
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, run_here

from trainrun.data.store_writer import write_token_store

LANGUAGE = ["task=masked_lm", "data=text", "model=bert_tiny", "max_duration=2ba", "progress=false"]


@pytest.fixture(scope="module")
def token_store(tmp_path_factory) -> Path:
    documents = [f"document {i} says {' '.join(['word'] * (i % 7 + 3))} about python code." for i in range(60)]
    return write_token_store(documents[:50], documents[50:], tmp_path_factory.mktemp("store") / "store", 120)


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }


def store_copy(token_store: Path, where: Path, damage) -> list[str]:
    copy = where / "store"
    shutil.copytree(token_store, copy)
    damage(copy)
    return [*LANGUAGE, f"data.path={copy}"]


def run_copy(trained_run: Path, where: Path, damage) -> Path:
    copy = where / "runs" / "run"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    damage(copy)
    return copy


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def config_name_not_yaml(ctx) -> list[str]:
    ctx.write("mine.yaml", "defaults:\n  - config\nalgorithms: [ema,\n")
    return ["--config-dir", str(ctx.tmp), "--config-name", "mine", *TINY]


def damaged_run_for_report(ctx, damage, *flags: str) -> list[str]:
    return ["report", *flags, str(run_copy(ctx.trained, ctx.tmp, damage).parent)]


def resumed_with_damaged_metrics(ctx) -> list[str]:
    run_dir = ctx.previous(lambda run: truncate(run / "metrics.jsonl", 30))
    return ["resume=auto", *TINY, f"hydra.run.dir={run_dir}"]


def write_text_with_tokenizer(ctx) -> list[str]:
    corpus = ctx.write("corpus.txt", "one document.\n\nanother one.")
    return ["write-text", corpus, str(ctx.tmp / "out"), "--tokenizer", ctx.write("tok.json", "{}")]


CASES = {
    "store.json not JSON": (
        lambda ctx: store_copy(ctx.store, ctx.tmp, lambda s: (s / "store.json").write_text('{"format": "trainrun/\n')),
        r"'.*/store/store\.json' is not valid JSON \(line 1, column \d+: .+\); it may have been cut short",
    ),
    "store.json of another kind": (
        lambda ctx: store_copy(ctx.store, ctx.tmp, lambda s: (s / "store.json").write_text("[1, 2]\n")),
        r"'.*/store/store\.json' is not a trainrun token store's description \(list\)",
    ),
    "token index not NumPy": (
        lambda ctx: store_copy(ctx.store, ctx.tmp, lambda s: (s / "train-000000.idx.npy").write_bytes(b"not numpy")),
        r"'.*/store/train-000000\.idx\.npy' is not a token store index \(a NumPy \.npy file\)",
    ),
    "token index of another shape": (
        lambda ctx: store_copy(ctx.store, ctx.tmp, lambda s: np.save(s / "train-000000.idx.npy", np.ones((2, 2)))),
        r"'.*/store/train-000000\.idx\.npy' is not a token store index \(rising document offsets from 0\)",
    ),
    "token file missing": (
        lambda ctx: store_copy(ctx.store, ctx.tmp, lambda s: (s / "train-000000.bin").unlink()),
        r"token store '.*/store' has no train-000000\.bin: write it again with 'trainrun write-text'",
    ),
    "weights not a checkpoint": (
        lambda ctx: [*TINY, f"model.weights={ctx.write('weights.pt', 'hello')}"],
        r"bad value for 'model\.weights': '.*/weights\.pt' is not a weights file \(a trainrun checkpoint or a "
        r"torch\.save'd state dict; torch\.load says ",
    ),
    "--config-name not YAML": (
        config_name_not_yaml,
        r"'.*/mine\.yaml' is not valid YAML: line 4, column 1: expected the node content, but found '<stream end>' "
        r"\(while parsing a flow node that starts at line 4\)",
    ),
    "recipe file not YAML": (
        lambda ctx: [*TINY, "recipe=" + ctx.write("fast.yaml", "name: fast\noptimizer: {lr: 0.1\n")],
        r"'"
        + "{tmp}"
        + r"/fast\.yaml' is not valid YAML: line 3, column 1: expected ',' or '}', but got '<stream end>' "
        r"\(while parsing a flow mapping that starts at line 2\)",
    ),
    "run dir under a file": (
        lambda ctx: [*TINY, f"hydra.run.dir={ctx.write('file', '')}/run"],
        r"bad value for 'hydra\.run\.dir': '.*/file/run' cannot be made: '.*/file' is a file",
    ),
    "multirun dir under a file": (
        lambda ctx: ["-m", *TINY, "seed=1,2", f"hydra.sweep.dir={ctx.write('file', '')}/sweep"],
        r"bad value for 'hydra\.sweep\.dir': '.*/file/sweep' cannot be made: '.*/file' is a file",
    ),
    "metrics.jsonl of a resumed run": (
        resumed_with_damaged_metrics,
        r"'.*/metrics\.jsonl' line 1 is not a JSON record \(Unterminated string",
    ),
    "summary.json in a report": (
        lambda ctx: damaged_run_for_report(ctx, lambda run: truncate(run / "summary.json", 40)),
        r"'.*/run/summary\.json' is not valid JSON \(line \d+, column \d+: .*\); it may have been cut short",
    ),
    "config.yaml in a report": (
        lambda ctx: damaged_run_for_report(ctx, lambda run: (run / "config.yaml").write_text("a: [\n")),
        r"'.*/run/config\.yaml' is not valid YAML: line 2, column 1",
    ),
    "steps.jsonl in a report": (
        lambda ctx: damaged_run_for_report(
            ctx, lambda run: truncate(run / "steps.jsonl", 20), "--first-epoch-as-second"
        ),
        r"'.*/run/steps\.jsonl' line 1 is not a JSON record",
    ),
    "auto.json in a report": (
        lambda ctx: damaged_run_for_report(ctx, lambda run: (run / "auto.json").write_bytes(b"\xff\xfe")),
        r"'.*/run/auto\.json' is not a text file \(byte 0 is not UTF-8\)",
    ),
    "tokenizer for write-text": (
        write_text_with_tokenizer,
        r"'.*/tok\.json' is not a tokenizer\.json of the tokenizers library \(",
    ),
    "JSON-lines corpus": (
        lambda ctx: ["write-text", ctx.write("corpus.jsonl", '{"text": "fine"}\n{"text": 3}\n'), str(ctx.tmp / "out")],
        r"corpus file '.*/corpus\.jsonl' line 2 has no \"text\" string",
    ),
}


class Context:
    def __init__(self, tmp: Path, store: Path, trained: Path) -> None:
        self.tmp, self.store, self.trained = tmp, store, trained

    def write(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)

    def previous(self, damage) -> Path:
        copy = self.tmp / "previous"
        shutil.copytree(self.trained, copy)
        damage(copy)
        return copy


@pytest.mark.parametrize("kind", list(CASES))
def test_a_damaged_or_foreign_file_is_one_line_naming_it_and_nothing_is_written(
    kind, tmp_path, token_store, trained_run
):
    make_args, message = CASES[kind]
    context = Context(tmp_path, token_store, trained_run)
    args = make_args(context)
    before = snapshot(tmp_path)
    result = run_here(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainrun: error: "), result.stderr
    assert re.match(message.replace("{tmp}", re.escape(str(tmp_path))), lines[0].removeprefix("trainrun: error: ")), (
        lines[0]
    )
    assert snapshot(tmp_path) == before, "something was written"


def test_every_recipe_prints_its_config_without_data(tmp_path):
    """``--cfg job`` needs no files: a text recipe prints though it has no token store yet."""
    result = run_here("--cfg", "job", "recipe=bert_base", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: masked_lm" in result.stdout and "path: null" in result.stdout
