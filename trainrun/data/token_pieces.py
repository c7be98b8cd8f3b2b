"""Token files read as one array: the shards of a store, or llm.c's token shards, end to end.

Written here because NumPy has no concatenated view of several memory-mapped files (``np.concatenate``
copies them whole, and a 10-billion-token corpus does not fit in memory): slices and index arrays
are answered from the files that hold them, nothing else is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
