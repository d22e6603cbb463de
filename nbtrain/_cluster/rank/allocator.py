"""Keep a rank's freed tensor memory for its next step instead of handing it back to the OS.

A training step allocates the same activations and gradients every time. With
glibc's defaults, a block over the *mmap threshold* (128 KiB at start, raised
by glibc as it sees big frees, at most 32 MiB) is a fresh ``mmap`` and is
unmapped again when freed, and a heap whose free top passes the *trim
threshold* is shrunk: either way the next step touches brand-new pages that
the kernel must fault in and zero. On the benchmark's small CNN that was about
10 000 page faults per step (3 200 to 14 100 per rank) and a tenth of the
step's CPU; a Ray worker, whose allocation history differs from a plain
script's, was hit harder than the same code under torchrun
(``benchmarks/README.md`` has the figures).

Raising both thresholds (what jemalloc or tcmalloc, which PyTorch's tuning
guide recommends preloading, do in effect) keeps that memory in the process:
after the first steps, allocations reuse pages already mapped. The price is
memory held, not returned: up to ``TRIM_THRESHOLD_BYTES`` of freed heap stays
with the rank, and a rank's resident size tracks its peak rather than its
current use.

Set ``NBTRAIN_MALLOC_TUNING=0`` (or ``false``/``no``/``off``) in the run's
``env`` to keep glibc's defaults. Malloc settings the user already gave glibc
(``MALLOC_*_`` variables, ``GLIBC_TUNABLES``) win: nbtrain then leaves the
allocator alone.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

OPT_OUT_VARIABLE = "NBTRAIN_MALLOC_TUNING"
OPT_OUT_VALUES = ("0", "false", "no", "off")
# Blocks below this come from the heap, so their pages are reused. Some glibc builds refuse
# more than 32 MiB (mallopt(3)); that still covers the activations of typical batches.
MMAP_THRESHOLDS_BYTES = (512 * 2**20, 32 * 2**20)
TRIM_THRESHOLD_BYTES = 1024 * 2**20  # free heap kept for the next step before any is given back
_M_TRIM_THRESHOLD = -1               # mallopt parameter numbers, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if they were set.

    False, and the allocator untouched, where the C library is not glibc (macOS,
    musl), the user opted out, or the user gave glibc malloc settings of their
    own. Call it before the training code allocates: it changes where later
    allocations come from, not blocks already handed out.
    """
    if os.environ.get(OPT_OUT_VARIABLE, "1").strip().lower() in OPT_OUT_VALUES or _user_tuned_malloc():
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    # The mmap threshold first: setting either one stops glibc from moving both, so a refused
    # mmap threshold must not leave a fixed trim threshold behind with the 128 KiB default.
    if not any(mallopt(_M_MMAP_THRESHOLD, value) for value in MMAP_THRESHOLDS_BYTES):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def _user_tuned_malloc() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(os.environ.get(name) for name in _USER_SETTINGS) or "glibc.malloc" in tunables


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # glibc names itself here; musl and macOS do not
            return None
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (ValueError, OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
