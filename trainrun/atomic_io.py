"""Atomic writes (a reader sees the old file or the whole new one, never half of it), and reads
that name the file, and the line, when one is damaged or of the wrong kind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from trainrun.errors import FileFormatError


def atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Replace ``path`` with what ``write`` puts into a binary handle: a temporary file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """A fresh folder to fill; on success it replaces ``path`` whole, on an error it is removed and
    ``path`` is left as it was. Named by host and process, as nodes may share a disk."""
    partial = path.with_name(f".{path.name}.partial-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
        if path.exists():
            shutil.rmtree(path)
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_text(path: Path) -> str:
    """``path``'s text (UTF-8); :class:`FileFormatError` naming it if it is not text."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise FileFormatError(f"'{path}' is not a text file (byte {error.start} is not UTF-8)") from None
    except IsADirectoryError:
        raise FileFormatError(f"'{path}' is a folder, not a file") from None


def read_json(path: Path) -> Any:
    """The JSON document in ``path``; :class:`FileFormatError` naming the file and line if it is not one."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise FileFormatError(
            f"'{path}' is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); "
            "it may have been cut short: write it again"
        ) from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file; an empty list if it does not exist."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise FileFormatError(f"'{path}' line {number} is not a JSON record ({error.msg})") from None
    return records


def read_yaml(path: Path) -> Any:
    """The YAML document in ``path``; :class:`FileFormatError` naming the file and line if it is not one."""
    import yaml

    text = read_text(path)
    try:  # libyaml's parser (7x faster: a report of thousands of runs reads a config each)
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        pass
    try:  # Python's parser, for its messages, which say more: what it expected, and what it found instead
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise FileFormatError(yaml_error_message(error, path)) from None


def yaml_error_message(error: Exception, path: Path | str | None = None) -> str:
    """One line for a YAML parse error: the file, the line and column, what is wrong."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    name = path or (mark.name if mark is not None else "?")
    where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    since = f" ({context} that starts at line {start.line + 1})" if context and start is not None else ""
    return f"'{name}' is not valid YAML:{where} {problem}{since}"
