"""Progress of a local build: files done of total, rate, time left.

On a terminal, `ProgressDisplay` redraws one status line in place; elsewhere
(a CI log, a cron mail) `ProgressLog` prints a plain line every
``--progress-every`` seconds (default 30), so a long build is not silent
until it ends, and a short one prints nothing extra.

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
display never shows more than the total. A stream whose reader went away
(``kiln build 2>&1 | head``) gets no more lines and stops nothing (`console`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from kiln import console
from kiln.pipeline.storage import is_remote

PROGRESS_FILENAME = "progress"
# How often a counting DoFn writes its pending count, and the display redraws.
_FLUSH_SECONDS = 0.2
_REDRAW_SECONDS = 0.5
# Off a terminal: a line this often (`kiln build --progress-every`).
DEFAULT_EVERY_SECONDS = 30.0
# The rate (and so the time left) is estimated from the files done after the
# first one, over at least this long: before the first file the job is
# starting (workers, imports), which says nothing about the rate.
_MIN_RATE_SECONDS = 1.0


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


def status_line(
    done: int,
    total: int,
    elapsed: float,
    rate: float | None = None,
    *,
    unit: str = "files",
    after_last: str = "writing shards and statistics",
) -> str:
    """``1234/5000 files (24.7%), 85.3 files/s, 0:44 left``.

    `elapsed` is the time the files took so far (the display stops the clock
    when the last one is done). `rate` is files per second (see
    `RateEstimate`; 0: not known yet, none shown), None: ``done / elapsed``.
    Nothing is estimated before the first file is done; after the last, the
    job still writes shards and statistics (`after_last`; `unit` names what
    is counted).
    """
    done = min(done, total)
    percent = 100.0 * done / total if total else 100.0
    line = f"{done}/{total} {unit} ({percent:.1f}%)"
    if rate is None and done and elapsed > 0:
        rate = done / elapsed
    if done and rate:
        line += f", {rate:.1f} {unit}/s"
        if done < total:
            line += f", {_duration((total - done) / rate)} left"
    if done >= total and after_last:
        line += f"; {after_last}"
    return line


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class RateEstimate:
    """Files per second, measured from the first file done on.

    The time before the first file is the job starting (worker processes,
    imports, the first bundle): counting it would make the first estimates
    far too slow (a 20 s build once showed ``16:42 left``). None until
    `_MIN_RATE_SECONDS` have passed since the first file and more were done.
    """

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None

    def update(self, now: float, done: int) -> float | None:
        if done <= 0:
            return None
        if self._first is None:
            self._first = (now, done)
            return None
        started, first_done = self._first
        if now - started < _MIN_RATE_SECONDS or done <= first_done:
            return None
        return (done - first_done) / (now - started)


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
        self._rate = RateEstimate()
        self._last_rate: float | None = None

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
        console.write("\n", self._stream)

    @property
    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _run(self) -> None:
        while not self._stop.wait(_REDRAW_SECONDS):
            self.draw()

    def line(self) -> str:
        """The current status line, prefixed."""
        done = files_done(self.path)
        now = self.clock()
        if done >= self.total and self._all_done_at is None:
            self._all_done_at = now
        if self._all_done_at is None or self._last_rate is None:
            self._last_rate = self._rate.update(now, min(done, self.total)) or self._last_rate
        elapsed = (self._all_done_at if self._all_done_at is not None else now) - self._started
        return self.prefix + status_line(done, self.total, elapsed, self._last_rate or 0.0)

    def draw(self) -> None:
        line = self.line()
        # Pad over the previous, possibly longer, line; \r returns to its start.
        # A reader that went away (`| head`) does not stop the build.
        console.write("\r" + line.ljust(self._width), self._stream)
        self._width = len(line)


@dataclasses.dataclass
class ProgressLog(ProgressDisplay):
    """A plain progress line every `every` seconds, for logs (not a terminal).

    Nothing for a build shorter than `every`; a build that printed a line
    also prints its last one (all files done) when the job ends.
    """

    every: float = DEFAULT_EVERY_SECONDS

    def __post_init__(self):
        super().__post_init__()
        self._printed = False

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.draw()

    def draw(self) -> None:
        console.write(self.line() + "\n", self._stream)
        self._printed = True

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._printed and exc_info[0] is None:
            self.draw()


class _NoDisplay:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


def display(
    path: str | None,
    total: int,
    enabled: bool,
    every: float = DEFAULT_EVERY_SECONDS,
    stream: TextIO | None = None,
):
    """The progress of the job counting into `path`, on `stream` (default stderr).

    A `ProgressDisplay` on a terminal, a `ProgressLog` elsewhere (none if
    `every` is 0), or a no-op context when not `enabled`.
    """
    if not enabled or path is None:
        return _NoDisplay()
    target = stream if stream is not None else sys.stderr
    if target.isatty():
        return ProgressDisplay(path, total, stream=stream)
    if every <= 0:
        return _NoDisplay()
    return ProgressLog(path, total, stream=stream, every=every)


class LoopProgress:
    """Progress of a loop run in the caller's thread (`kiln demo-data`): call
    `update` after each item and `close` at the end.

    As for a build: on a terminal one line redrawn in place (at most every
    half second), elsewhere a plain line every `every` seconds (0: none),
    and the last line at the end if any was printed.
    """

    def __init__(
        self,
        total: int,
        *,
        prefix: str,
        unit: str,
        every: float = DEFAULT_EVERY_SECONDS,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.prefix = prefix
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self._terminal = self.stream.isatty()
        self._interval = _REDRAW_SECONDS if self._terminal else every
        self._started = clock()
        self._shown_at = self._started
        self._rate = RateEstimate()
        self._last_rate: float | None = None
        self._done = 0
        self._width = 0
        self._printed = False

    def update(self, done: int) -> None:
        self._done = done
        now = self.clock()
        self._last_rate = self._rate.update(now, done) or self._last_rate
        if self._interval > 0 and now - self._shown_at >= self._interval:
            self._shown_at = now
            self._show(now)

    def close(self) -> None:
        if self._printed:
            self._show(self.clock())
            if self._terminal:
                console.write("\n", self.stream)

    def _show(self, now: float) -> None:
        line = self.prefix + status_line(
            self._done,
            self.total,
            now - self._started,
            self._last_rate or 0.0,
            unit=self.unit,
            after_last="",
        )
        if self._terminal:
            console.write("\r" + line.ljust(self._width), self.stream)
            self._width = len(line)
        else:
            console.write(line + "\n", self.stream)
        self._printed = True
