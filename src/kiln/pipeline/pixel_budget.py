"""A cap on the pixels being decoded at once by the threads of one image step.

Each header passes `image.max_pixels` on its own, but the image threads
decode several files at once: without a cap, a run of large images (each
within the limit) multiplies the memory by the number of threads. A file
holds its share of the budget from its header check (`decode_image` calls
``before_decoding``) until its record is encoded, when its pixels are freed.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
from collections.abc import Iterator


class PixelBudget:
    """Admits reservations while the pixels in flight stay within `total`.

    Reservations are admitted in the order they ask (one waiting for room
    holds back those after it, so a large image is not overtaken forever by
    small ones), and one larger than the whole budget runs alone: it waits
    until nothing else is in flight. Thread-safe.

    Args:
      total: Pixels in flight at most, apart from a single larger image.
    """

    def __init__(self, total: int):
        if total < 1:
            raise ValueError(f"total must be positive, got {total!r}")
        self.total = total
        self._in_flight = 0
        self._queue: collections.deque[int] = collections.deque()
        self._tickets = itertools.count()
        self._changed = threading.Condition()

    @property
    def in_flight(self) -> int:
        """Pixels reserved now."""
        with self._changed:
            return self._in_flight

    @contextlib.contextmanager
    def reservation(self) -> Iterator[Reservation]:
        """A reservation to `acquire` into, released when the block ends."""
        reservation = Reservation(self)
        try:
            yield reservation
        finally:
            reservation.release()

    def _acquire(self, pixels: int) -> None:
        with self._changed:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            try:
                while not (self._queue[0] == ticket and self._fits(pixels)):
                    self._changed.wait()
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()  # the next in line may fit too, or be first now
            self._in_flight += pixels

    def _fits(self, pixels: int) -> bool:
        return self._in_flight == 0 or self._in_flight + pixels <= self.total

    def _release(self, pixels: int) -> None:
        with self._changed:
            self._in_flight -= pixels
            self._changed.notify_all()


class Reservation:
    """One file's share of a `PixelBudget`: at most one `acquire`."""

    def __init__(self, budget: PixelBudget):
        self._budget = budget
        self._pixels = 0

    def acquire(self, pixels: int) -> None:
        """Blocks until `pixels` fit in the budget, then holds them."""
        if self._pixels:
            raise RuntimeError("this reservation already holds pixels")
        if pixels < 1:
            raise ValueError(f"pixels must be positive, got {pixels!r}")
        self._budget._acquire(pixels)
        self._pixels = pixels

    def release(self) -> None:
        if self._pixels:
            self._budget._release(self._pixels)
            self._pixels = 0
