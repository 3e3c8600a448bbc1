"""Writing to stdout and stderr when their reader may have gone away or
their file cannot take more, and lining up text in a terminal's columns.

``kiln build ... 2>&1 | head -3`` closes the pipe after three lines; every
later write to it fails with EPIPE (Python ignores SIGPIPE, so it raises
`BrokenPipeError` instead of ending the process). ``kiln verify ... >
/dev/full``, or a log file on a disk that filled up, fails with ENOSPC; a
terminal that went away, with EIO. What kiln prints for a person (a
summary, a verdict line, progress, the failure line) goes through `write`:
when it cannot be written, the work goes on (a build still publishes and
writes its ``--report``), the rest of that output is dropped and the
command exits with its own code, which says what happened. The stream's
file descriptor is pointed at ``/dev/null``, so that nothing written to it
later (a log line, the interpreter's last flush) fails again.

Where stdout is the product a script or a file keeps (``kiln inspect
--json``, ``kiln diff --json``, ``kiln lint --format json``), the command
writes it through an `Output`: a reader that went away is dropped as above
(``| head`` wanted no more), but a write that fails for any other reason
must not look like success, so the command exits 73
(`kiln.errors.OutputNotWritten`) with one line on stderr saying so, unless
it found a problem (exit 1), which is reported as usual.

Tables the commands print (class names in `kiln inspect`, `kiln diff`, the
legend of `kiln preview`) pad names by the columns a terminal gives them
(`width`, `pad`), not by their length: a wide character such as 猫 takes two.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from typing import Protocol, TextIO

from kiln.errors import EXIT_OK, OutputNotWritten

logger = logging.getLogger(__name__)


def write(text: str, stream: TextIO) -> bool:
    """Writes `text` to `stream` and flushes it. False, with the stream
    discarded from then on (`discard`), if it cannot be written: its reader
    has gone away (EPIPE), its disk is full (ENOSPC), its device failed (EIO)."""
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        _discard_stream(stream)
        return False
    return True


def discard(fd: int) -> None:
    """Points the file descriptor `fd` (1, 2) at /dev/null: its reader is
    gone, or it cannot be written."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _discard_stream(stream: TextIO) -> None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file: nothing to point elsewhere
        return
    discard(fd)


class Writer(Protocol):
    """What text is written to: a file, `io.StringIO`, an `Output`."""

    def write(self, text: str, /) -> object: ...


class Output:
    """A command's product on `stream` (stdout): what a script reads or a
    file keeps, such as ``kiln diff --json``'s document.

    `write` takes text as a file does (`json.dump` may write to it) and
    buffers as the stream does; `finish` flushes it and turns the command's
    exit code into what the run reports. A reader that went away (EPIPE)
    is not a failure: the rest is dropped, as `kiln.console.write` drops
    it. Any other failure to write (ENOSPC, EIO) drops the rest too and is
    reported by `finish`.
    """

    def __init__(self, stream: TextIO, what: str) -> None:
        """`what` names the product in the line that says it was not
        written (``the JSON summary``)."""
        self._stream = stream
        self._what = what
        self._dropped = False
        self.failure: str | None = None  # why it could not be written (not EPIPE)

    def write(self, text: str) -> None:
        if self._dropped:
            return
        try:
            self._stream.write(text)
        except OSError as e:
            self._drop(e)

    def finish(self, exit_code: int = EXIT_OK) -> int:
        """Flushes the output; `exit_code`, the command's verdict, unless the
        output could not be written.

        Raises:
          OutputNotWritten: it could not be written (not a reader that went
            away) and `exit_code` says the command succeeded. After a
            verdict that is not success, that is logged as an error instead:
            the verdict is what the run reports, as for ``kiln build
            --report``.
        """
        if not self._dropped:
            try:
                self._stream.flush()
            except OSError as e:
                self._drop(e)
        if self.failure is None:
            return exit_code
        problem = (
            f"stdout: cannot write {self._what}: {self.failure}; what was written is incomplete"
        )
        if exit_code == EXIT_OK:
            raise OutputNotWritten(problem)
        logger.error("%s", problem)
        return exit_code

    def _drop(self, error: OSError) -> None:
        self._dropped = True
        if not isinstance(error, BrokenPipeError):
            self.failure = error.strerror or str(error)
        _discard_stream(self._stream)


def width(text: str) -> int:
    """The terminal columns `text` takes: two for a wide or full-width
    character (CJK), none for a combining mark, one for any other."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def pad(text: str, columns: int) -> str:
    """`text` followed by spaces up to `columns` terminal columns (`width`):
    what ``f"{text:<{columns}}"`` does for ASCII."""
    return text + " " * max(columns - width(text), 0)
