"""Token files read as one array: the shards of a store, or llm.c's token shards, end to end.

Written here because NumPy has no concatenated view of several memory-mapped files (``np.concatenate``
copies them whole, and a 10-billion-token corpus does not fit in memory): slices and index arrays
are answered from the files that hold them, nothing else is read. Each file is mapped when it is
first read and kept among the :data:`OPEN_FILES` last read in the process (a mapping holds a file
descriptor: a 10-billion-token corpus in 2^24-token shards is ~600 files, C4 ~20,000, in every
loader worker, where many systems allow 1,024).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

OPEN_FILES = 64  # memory mappings a process keeps open (least recently read closed first)
_open: OrderedDict[tuple, np.memmap] = OrderedDict()


class MappedTokens:
    """The ``count`` tokens of type ``dtype`` at byte ``offset`` of the file at ``path``, read as a
    1-D array through a mapping opened on first read and closed when :data:`OPEN_FILES` later files
    have been read (a view already handed out keeps its mapping until it is dropped)."""

    def __init__(self, path: Path, dtype: str | np.dtype, count: int, offset: int = 0) -> None:
        self.path, self.dtype, self.count, self.offset = Path(path), np.dtype(dtype), count, offset
        self.key = (str(self.path), self.dtype.str, count, offset)  # its mapping's, among the process's

    def __len__(self) -> int:
        return self.count

    @property
    def mapped(self) -> np.memmap:
        mapping = _open.get(self.key)
        if mapping is not None:  # every batch's read: the mapping moved to the most recently read
            _open.move_to_end(self.key)
            return mapping
        mapping = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.count,))
        while len(_open) >= OPEN_FILES:
            _open.popitem(last=False)
        _open[self.key] = mapping
        return mapping

    def __getitem__(self, key: slice | np.ndarray | int) -> np.ndarray:
        return self.mapped[key]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.array(self.mapped, dtype=dtype or self.dtype)


class ConcatenatedTokens:
    """``pieces`` (1-D token arrays of one type, memory-mapped or not) read as one array."""

    def __init__(self, pieces: Sequence[np.ndarray], dtype: str | np.dtype) -> None:
        self.pieces = [piece for piece in pieces if len(piece)]
        self.dtype = np.dtype(dtype)
        self.ends = np.cumsum([len(piece) for piece in self.pieces], dtype=np.int64)
        self.starts = self.ends - [len(piece) for piece in self.pieces]

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.concatenate([*self.pieces, np.zeros(0, self.dtype)]).astype(dtype or self.dtype, copy=False)

    def __getitem__(self, key: slice | np.ndarray | int) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("token arrays are sliced with step 1")
            first, last = np.searchsorted(self.ends, [start, max(start, stop - 1)], side="right")
            parts = [
                self.pieces[piece][max(start - self.starts[piece], 0) : stop - self.starts[piece]]
                for piece in range(first, min(last + 1, len(self.pieces)))
            ]
            return np.concatenate([*parts, np.zeros(0, self.dtype)]) if stop > start else np.zeros(0, self.dtype)
        positions = np.asarray(key)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"token position out of range (0 to {len(self) - 1})")
        piece = np.searchsorted(self.ends, positions, side="right")
        gathered = np.empty(positions.shape, self.dtype)
        for index in np.unique(piece):
            chosen = piece == index
            gathered[chosen] = self.pieces[index][positions[chosen] - self.starts[index]]
        return gathered[()] if gathered.ndim == 0 else gathered


def one_array(pieces: Sequence[np.ndarray], dtype: str | np.dtype) -> np.ndarray | ConcatenatedTokens:
    """``pieces`` as one array: the piece itself where there is one (no indirection), else concatenated."""
    filled = [piece for piece in pieces if len(piece)]
    if len(filled) == 1:
        return filled[0]
    return ConcatenatedTokens(filled, dtype) if filled else np.zeros(0, dtype)
