"""Keep a rank's freed tensor memory for its next step instead of handing it back to the OS.

A training step allocates the same activations and gradients every time. With
glibc's defaults, a block over the *mmap threshold* (128 KiB at start, raised
by glibc as it sees big frees, at most 32 MiB) is a fresh ``mmap`` and is
unmapped again when freed, and a heap whose free top passes the *trim
threshold* is shrunk: either way the next step touches brand-new pages and
the kernel faults and zeroes every one of them. On the benchmark's small CNN
that is ~6 000 to 11 000 page faults per step, about a tenth of the step's
CPU, and a Ray worker process, whose allocation history differs from a plain
script's, was hit harder than the same code under torchrun
(``benchmarks/README.md`` has the figures).

Raising both thresholds (what jemalloc or tcmalloc, which PyTorch's tuning
guide recommends preloading, do in effect) keeps that memory in the process:
after the first step, allocations reuse pages already mapped. The price is
memory held, not returned: up to ``TRIM_THRESHOLD_BYTES`` of freed heap stays
with the rank, and a rank's resident size tracks its peak rather than its
current use. Set ``NBTRAIN_MALLOC_TUNING=0`` in the run's ``env`` to keep
glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

OPT_OUT_VARIABLE = "NBTRAIN_MALLOC_TUNING"
MMAP_THRESHOLD_BYTES = 512 * 2**20   # blocks below this come from the heap, so their pages are reused
TRIM_THRESHOLD_BYTES = 1024 * 2**20  # free heap kept for the next step before any is given back
_M_TRIM_THRESHOLD = -1               # mallopt parameter numbers, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if they were set.

    A no-op (False) where the C library is not glibc (macOS, musl) or the user
    opted out. Call it before the training code allocates: it changes where
    later allocations come from, not blocks already handed out.
    """
    if os.environ.get(OPT_OUT_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    # Trim first: setting either threshold stops glibc from moving them itself.
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def _glibc_mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it; musl's mallopt ignores these settings
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
