"""Python's parser as CPython 3.11 runs it: one counter of the AST constructor's depth for the whole
interpreter (python/cpython#106905). A garbage collection inside a parse runs finalizers, Python code
that may hand the interpreter to another thread parsing too (numba does, compiling a function; ffcv
loads numba), and the parse then fails with ``SystemError: AST constructor recursion depth mismatch``.
The parses trainrun runs, and the imports that parse (pydantic reads a class's source for its field
docstrings: W&B's settings, which timm imports), run with the collector paused so that no Python code
runs inside them. Written here because no library pauses it.
"""

from __future__ import annotations

import ast
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector off for the block, as it was after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def parse_python(source: str) -> ast.Module:
    """``ast.parse`` with the garbage collector paused (:func:`collector_paused`)."""
    with collector_paused():
        return ast.parse(source)
