"""The only module that talks to the C allocator: return large freed buffers to the system.

glibc raises its mmap threshold each time a large mmapped buffer is freed (up to 32 MiB), after
which Pillow's 16 MiB image blocks come from per-thread heap arenas that keep the memory once
the image is gone. Four decompression bombs decoded one after another on four decode threads
then cost four images' worth of RSS, not one (measured: 1,180 MB against 646 MB for a
169-megapixel PNG). Pinning the threshold keeps every buffer of ``threshold`` bytes or more
mmapped, so it goes back to the system when freed. The service edges (``serve``, ``index``)
call :func:`pin_mmap_threshold`; the library never changes the process's allocator on its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["pin_mmap_threshold"]

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def pin_mmap_threshold(threshold: int = 4 * 2**20) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing to pin
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    log.debug("glibc mmap threshold pinned at %d bytes: %s", threshold, done)
    return done
