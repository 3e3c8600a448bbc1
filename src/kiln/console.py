"""Writing to stdout and stderr when their reader may have gone away, and
lining up text in a terminal's columns.

``kiln build ... 2>&1 | head -3`` closes the pipe after three lines; every
later write to it fails with EPIPE (Python ignores SIGPIPE, so it raises
`BrokenPipeError` instead of ending the process). What kiln prints is for a
reader; when there is none, the work goes on (a build still publishes and
writes its ``--report``) and the rest of the output is dropped, as
command-line tools do. The stream's file descriptor is pointed at
``/dev/null``, so that nothing written to it later (a log line, the
interpreter's last flush) fails again.

Tables the commands print (class names in `kiln inspect`, `kiln diff`, the
legend of `kiln preview`) pad names by the columns a terminal gives them
(`width`, `pad`), not by their length: a wide character such as 猫 takes two.
"""

from __future__ import annotations

import os
import unicodedata
from typing import TextIO


def write(text: str, stream: TextIO) -> bool:
    """Writes `text` to `stream` and flushes it. False, with the stream
    discarded from then on (`discard`), if its reader has gone away."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a file: nothing to point elsewhere
            return False
        discard(fd)
        return False
    return True


def discard(fd: int) -> None:
    """Points the file descriptor `fd` (1, 2) at /dev/null: its reader is gone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


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
