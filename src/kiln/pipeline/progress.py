"""Progress of a local build on a terminal: files done of total, rate, time left.

The image step counts the files it finishes, kept or dropped, with a
`FileCounter`, which appends one byte per file to a small file in the
staging work folder; the
launcher's `ProgressDisplay` thread polls that file's size and redraws one
status line. A file and not Beam metrics, because the local runner hands
out its metrics only when the whole job has finished; and a file works alike
for worker threads and worker processes
(``--direct_running_mode=multi_processing``). Only for local runners with a
local work folder: Dataflow's console shows the progress of remote jobs.

A retried bundle counts its files again, so the count can overshoot; the
display never shows more than the total.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from kiln.pipeline.storage import is_remote

PROGRESS_FILENAME = "progress"
# How often a counting DoFn writes its pending count, and the display redraws.
_FLUSH_SECONDS = 0.2
_REDRAW_SECONDS = 0.5


class FileCounter:
    """Counts files by appending one byte each to a local file, at most
    every `_FLUSH_SECONDS` (the image step keeps one per DoFn instance)."""

    def __init__(self, path: str):
        self._path = path
        self._fd: int | None = None
        self._pending = 0
        self._flushed_at = 0.0

    def open(self) -> None:
        # O_APPEND: writes from several threads or processes never overwrite each other.
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def add(self, files: int = 1) -> None:
        self._pending += files
        if time.monotonic() - self._flushed_at >= _FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self._pending and self._fd is not None:
            os.write(self._fd, b"." * self._pending)
            self._pending = 0
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            self.flush()
            os.close(self._fd)
            self._fd = None

    def __getstate__(self):  # pickled into the job: the path only, never an open descriptor
        return {"_path": self._path, "_fd": None, "_pending": 0, "_flushed_at": 0.0}


def counting_path(work_dir: str) -> str | None:
    """Where the job counts files, or None when the work folder is not local."""
    if is_remote(work_dir):
        return None
    return os.path.join(work_dir, PROGRESS_FILENAME)


def files_done(path: str) -> int:
    """Files counted so far (0 before the first is done)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def status_line(done: int, total: int, elapsed: float) -> str:
    """``1234/5000 files (24.7%), 85.3 files/s, 0:44 left``.

    `elapsed` is the time the files took so far (the display stops the clock
    when the last one is done). Nothing is estimated before the first file
    is done; after the last, the job still writes shards and statistics.
    """
    done = min(done, total)
    percent = 100.0 * done / total if total else 100.0
    line = f"{done}/{total} files ({percent:.1f}%)"
    if done and elapsed > 0:
        rate = done / elapsed
        line += f", {rate:.1f} files/s"
        if done < total:
            line += f", {_duration((total - done) / rate)} left"
    if done >= total:
        line += "; writing shards and statistics"
    return line


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


@dataclasses.dataclass
class ProgressDisplay:
    """Redraws a status line on `stream` from a thread while the job runs.

    Use as a context manager around running the job. On leaving, draws the
    final line and ends it with a newline.
    """

    path: str
    total: int
    stream: TextIO | None = None  # None: sys.stderr at the time of drawing
    prefix: str = "kiln build: "
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._all_done_at: float | None = None
        self._width = 0

    def __enter__(self) -> ProgressDisplay:
        self._started = self.clock()
        self._thread = threading.Thread(target=self._run, name="kiln-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.draw()
        self._stream.write("\n")
        self._stream.flush()

    @property
    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _run(self) -> None:
        while not self._stop.wait(_REDRAW_SECONDS):
            self.draw()

    def draw(self) -> None:
        done = files_done(self.path)
        now = self.clock()
        if done >= self.total and self._all_done_at is None:
            self._all_done_at = now
        elapsed = (self._all_done_at if self._all_done_at is not None else now) - self._started
        line = self.prefix + status_line(done, self.total, elapsed)
        # Pad over the previous, possibly longer, line; \r returns to its start.
        self._stream.write("\r" + line.ljust(self._width))
        self._stream.flush()
        self._width = len(line)


class _NoDisplay:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


def display(path: str | None, total: int, enabled: bool):
    """A `ProgressDisplay` for the job counting into `path`, or a no-op context."""
    if not enabled or path is None:
        return _NoDisplay()
    return ProgressDisplay(path, total)
