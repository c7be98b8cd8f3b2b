"""Host memory: a training process reuses the blocks it frees instead of page-faulting fresh ones.

torch takes CPU tensors from the C library's ``malloc``. glibc serves a block above its mmap
threshold (32 MiB at most) with pages straight from the kernel and returns them at ``free``, and
trims the top of its heap whenever more than that threshold lies free there, so every step's large
tensors (a language model's logits and their gradient: batch x length x vocabulary floats; a
convolution's activations) are zero-filled again by page faults. On a 2-core CPU this was 30 % of
a small GPT's step, in kernel time (``bench/peers.py``). ``host_memory=reuse`` sets glibc's
``M_MMAP_MAX`` to 0 (every block from the heap) and ``M_TRIM_THRESHOLD`` to
:data:`KEPT_FREE_BYTES` (the heap's free top is handed back above it): after the first steps the
process allocates without asking the kernel. jemalloc and tcmalloc do the same, but only when
preloaded before the process starts (``LD_PRELOAD``), which a command cannot do for itself; this is
glibc's own knob (``mallopt``), reached through ctypes since Python has no binding for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
KEPT_FREE_BYTES = (1 << 31) - 1  # free heap kept at its top for the next step: 2 GiB, the most a C int holds


def reuse_freed_memory() -> bool:
    """Keep freed host memory in this process for reuse (see the module's text); whether the C
    library took the setting (glibc only: elsewhere nothing changes)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]  # a value past int's range raises, never wraps
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES))
