"""Lines native libraries write to stderr, kept out of a command's output.

C libraries write to the process's file descriptor 2 themselves, below
Python's `sys.stderr` and its logging, so the only way to keep a line of
theirs out is to point fd 2 at a temporary file for a while, then write
back what should be seen (`filtered_stderr`). Two uses:

- TensorFlow's start-up. Loading its shared libraries writes absl's
  ``WARNING: All log messages before absl::InitializeLog() is called are
  written to STDERR``, then INFO lines (``oneDNN custom operations are
  on``, ``Could not find cuda drivers``), once per library, whatever
  ``TF_CPP_MIN_LOG_LEVEL`` says. `install` adds an import hook that loads
  TensorFlow inside `filtered_stderr`, dropping absl's INFO and WARNING
  lines (`ABSL_NOTICES`). The kiln command line turns it on (not with
  ``--verbose``) through the environment variable `ENV`, which Beam's
  worker processes inherit: importing `kiln` installs the hook in any
  process where it is set. Library users get TensorFlow's usual output.
- ``kiln build --quiet``, which must print nothing when the build succeeds
  (cron mails any output). The image libraries inside OpenCV write
  warnings about files they read, accepted or not: ``libpng warning: iCCP:
  too short`` and ``libpng warning: tEXt: CRC error`` (common in real photo
  sets), libjpeg's ``Corrupt JPEG data: 4 extraneous bytes before marker
  0xd9``. They name no file, and a build cannot stop them at their source:
  libpng and libjpeg print with ``fprintf(stderr)``, not through OpenCV's
  logger. So the quiet build runs inside `filtered_stderr` with
  `IMAGE_LIBRARY_LINES` as what it drops. Beam's worker processes, started
  by the job, inherit the captured fd 2. The command logs how many lines
  were dropped, with an example, as a warning: the ``--report`` lists it,
  the console does not (`kiln.pipeline.command`).

What is dropped is a closed list of known line shapes; anything else (a
Python warning, a library's error message nobody anticipated, a crash's
last words) is written back, only later than it happened. libpng's
``libpng error:`` lines are on the list: libpng stops reading (or writing)
the file after one, OpenCV returns no image, and kiln drops the file with
its key in errors.jsonl, so the line says nothing the report does not.
Without ``--quiet`` nothing is captured: the lines show as they happen.

The command's own last line (``kiln build: failed: ...``) and tracebacks
are printed by `kiln.cli` after the build returned or raised, so after fd
2 was restored: Ctrl-C and SIGTERM raise in the main thread, and the
capture's ``finally`` restores fd 2 as they unwind. Only a SIGKILL loses
the captured lines (the temporary file is already unlinked). stdout (fd 1)
is never touched. Lines are read back one at a time, so a build that
warned a million times needs disk for them, not memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import IO, Any

from kiln import console

ENV = "KILN_QUIET_NATIVE_LOGS"

# absl's pre-initialization notice, and its INFO/WARNING lines:
# ``I0000 00:00:1796101836.284725    1159 cudart_stub.cc:31] Could not find...``
ABSL_NOTICES = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] )"
)
# What the image libraries inside OpenCV write about a file they read or
# write (see the module docstring), each a known shape, so that nothing
# else is taken for one:
IMAGE_LIBRARY_LINES = re.compile(
    rb"^(?:"
    # libpng's warnings and errors: ``libpng warning: iCCP: too short``.
    rb"libpng (?:warning|error): "
    # libjpeg(-turbo)'s warnings (jerror.h's JWRN_ messages), all of them:
    # ``Corrupt JPEG data: 4 extraneous bytes before marker 0xd9``,
    # ``Corrupt JPEG data: premature end of data segment``, ``... bad Huffman code``.
    rb"|Corrupt JPEG data: "
    rb"|Premature end of JPEG file$"
    rb"|Invalid SOS parameters for sequential JPEG$"
    rb"|Inconsistent progression sequence for component \d+ coefficient \d+$"
    rb"|Unknown Adobe color transform code \d+$"
    rb"|Warning: unknown JFIF revision number \d+\.\d+$"
    rb"|Application transferred too many scanlines$"
    # OpenCV's own warnings (its TIFF decoder passes libtiff's on as these):
    # ``[ WARN:0@2.869] global grfmt_tiff.cpp:123 TIFF_Warning TIFFReadDirectory: ...``.
    rb"|\[ WARN:\d+@\d+\.\d+\] "
    # libtiff's own warning handler, should a decoder not replace it as
    # OpenCV's does: ``TIFFReadDirectory: Warning, Unknown field with tag ...``.
    rb"|TIFF\w*: Warning, "
    # libtiff's own error handler, as Pillow leaves it (a TIFF's strips are
    # checked by decoding them with Pillow, `kiln.transforms.decode`):
    # ``tempfile.tif: Using code not yet in table.`` (Pillow's name for data
    # in memory), ``LZWDecode: Not enough data at scanline 0 (short 1525 bytes).``.
    rb"|tempfile\.tif: "
    rb"|(?:_?TIFF\w*|\w+Decode): .*\.$"
    rb")"
)
_QUIET_MODULES = ("tensorflow",)
# Kept lines are written back in pieces of about this size.
_WRITE_BACK_BYTES = 1 << 16


@dataclasses.dataclass
class DroppedLines:
    """What `filtered_stderr` kept off stderr: filled in when its block ends.

    Attributes:
      count: How many lines were dropped.
      first: The first of them, decoded (without its line end); "" for none.
    """

    count: int = 0
    first: str = ""


@contextlib.contextmanager
def filtered_stderr(drop: re.Pattern[bytes] = ABSL_NOTICES) -> Iterator[DroppedLines]:
    """Runs the block with fd 2 pointed at a temporary file; then restores
    fd 2 and writes back every line the block wrote there except those
    `drop` matches (at the line's start). Yields the `DroppedLines`, filled
    in once the block is over, however it ends. Without a stderr to capture,
    or a temporary file to capture it in, runs the block as it is.

    Nested, the inner one writes its kept lines into the outer one's file.
    Not for threads of their own: fd 2 is the process's.
    """
    dropped = DroppedLines()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to filter
        yield dropped
        return
    try:
        captured = tempfile.TemporaryFile()
    except OSError:  # no room for a temporary file: the lines show as they come
        os.close(saved)
        yield dropped
        return
    with captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield dropped
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            _write_back(captured, drop, dropped)


def _write_back(captured: IO[bytes], drop: re.Pattern[bytes], dropped: DroppedLines) -> None:
    captured.seek(0)
    kept: list[bytes] = []
    size = 0
    after_drop = False
    for line in captured:
        if drop.match(line):
            if not dropped.count:
                dropped.first = line.rstrip(b"\r\n").decode("utf-8", "replace")
            dropped.count += 1
            after_drop = True
            continue
        # libpng writes a warning and its line end in two calls: threads
        # decoding at once can put two warnings on one line and their line
        # ends after it, a blank line that belongs to what was dropped.
        if after_drop and not line.strip(b"\r\n"):
            continue
        after_drop = False
        kept.append(line)
        size += len(line)
        if size >= _WRITE_BACK_BYTES:
            _write_all(b"".join(kept))
            kept, size = [], 0
    _write_all(b"".join(kept))


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(2, view) :]
        except BrokenPipeError:  # stderr's reader went away (`2>&1 | head`): drop the rest
            console.discard(2)
            return


class _FilteredLoader(importlib.abc.Loader):
    """Runs another loader's `exec_module` inside `filtered_stderr`."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with filtered_stderr():
            self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # is_package, get_resource_reader...
        return getattr(self._loader, name)


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds `_QUIET_MODULES` as the other finders do, with `_FilteredLoader` as their loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _QUIET_MODULES:
            return None
        # Imported once per process: step aside, and let the others find it.
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteredLoader(spec.loader)
        return spec


def install() -> None:
    """Quiets TensorFlow's import in this process (if it is not imported yet)."""
    if any(name in sys.modules for name in _QUIET_MODULES):
        return
    if not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())
