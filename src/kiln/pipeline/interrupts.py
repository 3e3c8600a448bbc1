"""SIGINT and SIGTERM held once a build's version is published.

Once LATEST names the new version the build is done: what is left (staging
cleaned up, old versions pruned with ``--keep``, the summary and the report
written) can take seconds on a bucket, and a scheduler's stop or a Ctrl-C
in them used to exit 143 or 130, which says "nothing was published", and
leave the report `running`, of a version that was published. `kiln build`
arms a hold for its whole run (`held_once_published`); `published`, called
the moment LATEST is written, starts it: the first signal after that is
noted, not raised, and the build finishes and exits 0; a second one is
handled as before the hold (a cleanup or report write that hangs on an
unreachable bucket can still be stopped). Without an armed hold (the
library called from a program of its own), `published` does nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The hold `held_once_published` armed: a function starting it, or None.
_armed: Callable[[], None] | None = None


@contextlib.contextmanager
def held_once_published() -> Iterator[list[int]]:
    """Arms the hold for the block; yields the signals it held (the first only).

    Only in the main thread, where Python runs signal handlers and
    `kiln.cli` installs its own; elsewhere nothing is held.
    """
    global _armed
    held: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: types.FrameType | None) -> None:
        handler = previous.get(signum)
        if held and callable(handler):
            handler(signum, frame)
        held.append(signum)

    def start() -> None:
        if not previous and threading.current_thread() is threading.main_thread():
            previous.update({signum: signal.signal(signum, hold) for signum in _SIGNALS})

    outer, _armed = _armed, start
    try:
        yield held
    finally:
        _armed = outer
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def published() -> None:
    """Starts the armed hold, if any: LATEST names the build's version."""
    if _armed is not None:
        _armed()
