"""Reads that name a damaged file: JSON, JSON lines, YAML, text, and torch.load's failures, by message."""

import io
import pickle

import pytest
import torch

from trainrun.atomic_io import (
    atomic_write_json,
    atomic_write_text,
    read_json,
    read_jsonl,
    read_text,
    read_yaml,
    yaml_error_message,
)
from trainrun.core.checkpoint import load_failure
from trainrun.errors import FileFormatError


def refusal(read, path) -> str:
    """The one line ``read(path)`` refuses ``path`` with."""
    with pytest.raises(FileFormatError) as caught:
        read(path)
    return str(caught.value)


def test_json_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{\n  "status": "completed",\n  "train_seconds": \n')
    assert refusal(read_json, path) == (
        f"'{path}' is not valid JSON (line 4, column 1: Expecting value); it may have been cut short: write it again"
    )
    path.write_text('{"a": [1, 2]}')
    assert read_json(path) == {"a": [1, 2]}


def test_json_lines_name_the_bad_record_and_skip_blank_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []  # none yet
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n')
    with pytest.raises(FileFormatError, match=rf"^'{path}' line 4 is not a JSON record \(Expecting value\)$"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_text_that_is_not_utf8_or_a_folder_is_named(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(FileFormatError, match=rf"^'{path}' is not a text file \(byte 9 is not UTF-8\)$"):
        read_text(path)
    with pytest.raises(FileFormatError, match=rf"^'{tmp_path}' is a folder, not a file$"):
        read_text(tmp_path)


def test_yaml_names_the_file_the_line_and_where_the_construct_began(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("name: run\nalgorithms: [ema,\n  sam\n")
    assert refusal(read_yaml, path) == (
        f"'{path}' is not valid YAML: line 4, column 1: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence that starts at line 2)"
    )
    path.write_text("a:\n\tb: 1\n")  # a tab: a scanner error with no construct around it
    with pytest.raises(FileFormatError, match=rf"^'{path}' is not valid YAML: line 2, column 1: found character"):
        read_yaml(path)
    path.write_text("a: [1, 2]\n")
    assert read_yaml(path) == {"a": [1, 2]}


def test_a_yaml_error_without_a_position_says_what_it_can():
    import yaml

    assert yaml_error_message(yaml.YAMLError("bad document"), "x.yaml") == "'x.yaml' is not valid YAML: bad document"


def test_torch_load_failures_are_one_line_without_the_advice(tmp_path):
    text = tmp_path / "weights.pt"
    text.write_text("hello")
    foreign = tmp_path / "foreign.pt"
    torch.save({"path": tmp_path}, foreign)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    reasons = []
    for path in (text, foreign, empty):
        with pytest.raises(Exception) as caught:
            torch.load(path, weights_only=True)
        reasons.append(load_failure(caught.value))
    assert reasons[0] == "KeyError: 101"  # what torch's legacy reader makes of a text file
    assert reasons[1] == "Unsupported global: GLOBAL pathlib.PosixPath was not an allowed global by default"
    assert reasons[2] == "EOFError"
    assert load_failure(pickle.UnpicklingError("invalid load key, 'h'.\n\nadvice")) == (
        "UnpicklingError: invalid load key, 'h'."
    )


def test_a_composed_configs_yaml_error_names_the_file_its_mark_names():
    """Hydra hands over the parse error alone: the file is the one the error's mark names, from
    where the problem is or else where the construct began."""
    import yaml

    try:
        yaml.safe_load(io.StringIO("a: [1, 2\n"))
    except yaml.YAMLError as error:
        error.problem_mark.name = "/conf/recipe/mine.yaml"
        assert yaml_error_message(error).startswith("'/conf/recipe/mine.yaml' is not valid YAML: line 2, column 1: ")
        error.context_mark.name, error.problem_mark = "/conf/other.yaml", None  # only where it began
        assert yaml_error_message(error).startswith("'/conf/other.yaml' is not valid YAML: line 1, column 4: ")
    assert yaml_error_message(yaml.YAMLError("bad")) == "'?' is not valid YAML: bad"  # nothing to name


def test_torch_load_lines_naming_the_problem_are_cut_to_it():
    advice = (
        "Weights only load failed.\n\nWeightsUnpickler error: Unsupported operand 149. Please file an issue: error: x"
    )
    assert load_failure(pickle.UnpicklingError(advice)) == "Unsupported operand 149"
    assert (
        load_failure(pickle.UnpicklingError("Unsupported global: GLOBAL a.B. Add it"))
        == "Unsupported global: GLOBAL a.B"
    )


def test_writes_make_missing_folders_and_json_is_sorted_and_indented(tmp_path):
    nested = tmp_path / "a" / "b" / "c.json"
    atomic_write_json(nested, {"b": 1, "a": [1, 2]})
    assert nested.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert sorted(p.name for p in nested.parent.iterdir()) == ["c.json"]  # no temporary file left
    atomic_write_text(tmp_path / "d" / "e.txt", "café")
    assert (tmp_path / "d" / "e.txt").read_bytes() == "café".encode()
