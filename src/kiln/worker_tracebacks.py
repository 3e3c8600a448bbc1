"""Beam SDK workers' raw tracebacks, kept off stderr: kiln reports a failed job itself.

A Beam SDK worker whose bundle raises prints the traceback on its
`sys.stderr` (``SdkHarness._execute`` in ``apache_beam.runners.worker.sdk_worker``:
``print(traceback_string, file=sys.stderr)``, whatever the log level), then
sends it back to the runner, which raises it in the command's process: kiln's
one line says what failed (an internal error's line names the file the
traceback was saved to). The local runner's workers printed it above that
line, each of them, under ``--quiet`` too: with
``--direct_running_mode=multi_processing`` they are processes whose stderr
is the command's, with ``multi_threading`` threads of the command's process.

No pipeline option steers that print, and the worker processes' command
line is Beam's own (``python -m apache_beam.runners.worker.sdk_worker_main``).
`install` puts `_DroppingWorkerTracebacks` in front of `sys.stderr`: it
drops what that one Beam function writes (the traceback and print's line
end) and passes everything else on, so a Python warning, a thread's
uncaught exception and a crash's last words still show, as do the native
libraries' lines, written to fd 2 below `sys.stderr` (`kiln.native_logs`).

The kiln command line turns it on (not with ``--verbose``, under which the
workers' tracebacks show as Beam prints them) in its own process while a
command runs (`dropped`), and in Beam's worker processes through the
environment variable `ENV`, which they inherit: importing `kiln` installs
it in any process where it is set, and a worker imports kiln as it
unpickles the job's steps, before any of them runs. Nothing here imports
Beam: the function is recognized by its name and module.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

ENV = "KILN_QUIET_WORKER_TRACEBACKS"

_PRINTER_MODULE = "apache_beam.runners.worker.sdk_worker"
_PRINTER_FUNCTION = "_execute"


class _DroppingWorkerTracebacks:
    """A text stream that writes to another (`sys.stderr`) all but what
    Beam's ``SdkHarness._execute`` writes to it; anything else it is
    asked (``fileno``, ``flush``, ``encoding``...) is the other's."""

    def __init__(self, stream: TextIO):
        self.wrapped = stream

    def write(self, text: str) -> int:
        # print() is C: the frame that called it is the caller of write().
        caller = sys._getframe(1)
        if (
            caller.f_code.co_name == _PRINTER_FUNCTION
            and caller.f_globals.get("__name__") == _PRINTER_MODULE
        ):
            return len(text)
        return self.wrapped.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def install() -> None:
    """Drops Beam's worker tracebacks from this process's `sys.stderr`, for good."""
    if not isinstance(sys.stderr, _DroppingWorkerTracebacks) and sys.stderr is not None:
        sys.stderr = _DroppingWorkerTracebacks(sys.stderr)


@contextlib.contextmanager
def dropped() -> Iterator[None]:
    """Drops Beam's worker tracebacks from `sys.stderr` while the block runs
    (the local runner's ``multi_threading`` workers are this process's
    threads); then puts back the stream that was there, unless the block
    replaced it meanwhile."""
    stream = sys.stderr
    if isinstance(stream, _DroppingWorkerTracebacks) or stream is None:
        yield
        return
    wrapper = _DroppingWorkerTracebacks(stream)
    sys.stderr = wrapper
    try:
        yield
    finally:
        if sys.stderr is wrapper:
            sys.stderr = stream
