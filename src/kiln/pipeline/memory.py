"""Handing memory the process has freed back to the operating system.

glibc's allocator keeps freed memory in its arenas (one per thread that
allocated, up to eight per core) and returns it to the system only from the
top of each heap. The image step's threads allocate and free an image's
buffers thousands of times, so the holes they leave add up, more the
longer the step runs; the shard writer's peak (whole shards in memory)
then lands on top of them. `release_free_memory` asks glibc to give back
every free page (``malloc_trim``), which the shard writer does before each
shard it reads. Elsewhere (another libc, another system) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # this process's C library
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        logger.debug("no malloc_trim in this process's C library")
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Returns the allocator's free pages to the system (glibc); whether any were."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
