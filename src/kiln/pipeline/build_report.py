"""The end-of-build report as JSON (`kiln build --report FILE`), for schedulers.

One JSON object, written whether the build succeeded or not, so a scheduler
can read what happened without parsing the console::

    {"status": "built", "exit_code": 0, "name": "shapes", "version": "3f2a9c1b0d4e",
     "latest": "3f2a9c1b0d4e", "latest_set_by_hand": false,
     "dataset_dir": ".../shapes/3f2a9c1b0d4e", "splits": {"train": {"num_examples": 229, ...}},
     "dropped": {"corrupt": 1}, "dropped_total": 1, "duplicates": 0,
     "previous_version": "0a1b2c3d4e5f", "changes": {...}, ...}
    {"status": "failed", "exit_code": 1, "error": "dropped 40 of 300 input files ..."}

``status`` is ``built``, ``up_to_date`` (nothing to do: exit 0),
``dry_run`` (``--dry_run=True``: the job was translated, not submitted, and
nothing was published: exit 0), ``failed`` (exit 1, nothing published),
``usage_error`` (a bad config or flag: exit 2), ``busy`` (another build of
the dataset holds its lock: exit 3; a ``running`` report found at the path,
that build's or a killed one's, is left as it was), ``internal_error`` (an exception kiln
does not expect, a bug: exit 70, nothing published; ``traceback`` holds its
traceback) or ``interrupted`` (Ctrl-C: exit 130; SIGTERM: exit 143); or
``running`` (``exit_code`` null): the build started and has not ended, or
was killed outright (SIGKILL, the OOM killer, a lost machine) and could
not replace it; ``pid``, ``host`` and ``argv`` name its process,
``started`` when it began (UTC).
``latest`` is the version LATEST names after the build: ``version``, unless
someone pointed LATEST at another version by hand after ``version`` was
published (a rollback), which the build leaves as is
(``latest_set_by_hand``: true; ``changes``: null).
``changes`` is what changed since the version LATEST named before the build
(``previous_version``), as `kiln diff --json` prints it
(`kiln.schemas.version_diff.VersionDiff.to_json`), or null when there was
none. A failure of the publish gate adds ``gate``
(`launcher.GateError.gate_report`): the version kept unpublished, the
thresholds it crossed, and the comparison.
``warnings`` lists the warnings the build logged (one line each: a
previous version that could not be compared, a class left without examples),
in every report: ``kiln build --quiet`` prints none of them. Unlike
`kiln.json` it holds the wall-clock duration: it describes a run, not the
dataset.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import traceback
from typing import TYPE_CHECKING, Any

from kiln.errors import EXIT_BUSY, EXIT_FAILED, EXIT_INTERNAL, EXIT_USAGE, unexpected
from kiln.pipeline import storage
from kiln.schemas import DROPPED_OBJECTS_FILENAME, ERRORS_FILENAME

if TYPE_CHECKING:
    from kiln.pipeline.launcher import BuildResult

REPORT_FORMAT = 1


def succeeded(result: BuildResult, elapsed_seconds: float) -> dict[str, Any]:
    """The report of a build that published `result` (or found it up to date)."""
    info = result.info
    return {
        "report_format": REPORT_FORMAT,
        "status": "up_to_date" if result.up_to_date else "built",
        "exit_code": 0,
        "name": info.name,
        "version": result.version,
        # What LATEST names: `version`, unless it was set by hand (a rollback) and left so.
        "latest": result.latest_set_by_hand or result.version,
        "latest_set_by_hand": result.latest_set_by_hand is not None,
        "dataset_dir": result.dataset_dir,
        "dataset_root": result.dataset_root,
        "splits": {
            name: {"num_examples": split.num_examples, "num_shards": len(split.shards)}
            for name, split in sorted(info.splits.items())
        },
        "num_classes": info.num_classes,
        "dropped": dict(sorted(info.dropped.items())),
        "dropped_total": sum(info.dropped.values()),
        "errors_file": f"{result.dataset_dir.rstrip('/')}/{ERRORS_FILENAME}",
        # Objects removed from stored images (datasets with boxes), named in
        # objects_dropped_file; null without boxes.
        "objects_dropped": info.objects_dropped if info.objects is not None else None,
        "objects_dropped_file": (
            f"{result.dataset_dir.rstrip('/')}/{DROPPED_OBJECTS_FILENAME}"
            if info.dropped_objects_sha256 is not None
            else None
        ),
        "duplicates": info.duplicates,
        "duplicates_across_splits": result.duplicates_across_splits,
        "counters": dict(result.counters),
        "pruned": list(result.pruned),
        # How the build used a base version (reused/processed counts, or why
        # it built from scratch); null when up to date.
        "incremental": result.incremental.to_json() if result.incremental else None,
        "previous_version": result.previous_version,
        "changes": None if result.changes is None else result.changes.to_json(),
        "elapsed_seconds": round(elapsed_seconds, 3),
    }


_STATUS = {EXIT_FAILED: "failed", EXIT_USAGE: "usage_error", EXIT_BUSY: "busy"}


def failed(
    error: str, exit_code: int, elapsed_seconds: float, gate: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The report of a build that published nothing (exit 1), never started
    (exit 2) or found another build of the dataset running (exit 3).
    `gate`: what a publish gate failure says of the version it held back
    (`kiln.pipeline.launcher.GateError.gate_report`)."""
    report = {
        "report_format": REPORT_FORMAT,
        "status": _STATUS.get(exit_code, "failed"),
        "exit_code": exit_code,
        "error": error,
        "elapsed_seconds": round(elapsed_seconds, 3),
    }
    if gate is not None:
        report["gate"] = gate
    return report


def internal_error(error: BaseException, elapsed_seconds: float) -> dict[str, Any]:
    """The report of a build stopped by an exception kiln does not expect (a
    bug, exit 70): ``error`` is the line the command line prints of it
    (`kiln.errors.unexpected`), ``traceback`` its whole traceback, so that a
    scheduler that keeps only the report keeps what a bug report needs."""
    return {
        "report_format": REPORT_FORMAT,
        "status": "internal_error",
        "exit_code": EXIT_INTERNAL,
        "error": unexpected(error),
        "traceback": "".join(traceback.format_exception(error)),
        "elapsed_seconds": round(elapsed_seconds, 3),
    }


def interrupted(message: str, exit_code: int, elapsed_seconds: float) -> dict[str, Any]:
    """The report of a build stopped by Ctrl-C (exit 130) or SIGTERM (exit 143)."""
    return {
        "report_format": REPORT_FORMAT,
        "status": "interrupted",
        "exit_code": exit_code,
        "error": message,
        "elapsed_seconds": round(elapsed_seconds, 3),
    }


def running(name: str, dataset_root: str, config: str) -> dict[str, Any]:
    """The report of a build under way, written once its config checks out
    and replaced when it ends, whatever the end: a build killed outright
    (SIGKILL, the OOM killer, a lost machine) leaves this one, not the
    previous run's. ``pid`` and ``host`` say which process to look for,
    ``argv`` its command line as the system started it."""
    return {
        "report_format": REPORT_FORMAT,
        "status": "running",
        "exit_code": None,
        "name": name,
        "dataset_root": dataset_root,
        "config": os.path.abspath(config) if not storage.is_remote(config) else config,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": list(sys.orig_argv),
    }


def dry_run(message: str, elapsed_seconds: float) -> dict[str, Any]:
    """The report of a dry run (Beam's ``--dry_run=True``): translated, not
    submitted, nothing published."""
    return {
        "report_format": REPORT_FORMAT,
        "status": "dry_run",
        "exit_code": 0,
        "message": message,
        "elapsed_seconds": round(elapsed_seconds, 3),
    }


def write(path: str, report: dict[str, Any]) -> None:
    """Writes the report atomically (local path or gs://); a missing local
    folder is created. A local symbolic link is written through: the file it
    points to is replaced, the link stays."""
    if not storage.is_remote(path):
        path = os.path.realpath(path)
    storage.write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def destination_problem(path: str) -> str | None:
    """Why the report could not be written to `path`, or None: what a build
    checks before it starts, so that a report it cannot write stops it
    before anything is done rather than after it published.

    Locally (through symbolic links, as `write` writes): `path` must not be
    a folder, nor a file other than a regular one (a pipe or a device, which
    the atomic write would replace), and the nearest folder of its path that
    exists must be one this process can write in (`write` creates the rest).
    On an object store: its folder must be reachable (credentials, network,
    bucket), by one listing; whether the store allows this writer to create
    the object is known only by writing it.

    Raises:
      Exception: an error of the store that does not say it is unreachable
        (`storage.unreachable_reason`).
    """
    if storage.is_remote(path):
        folder = path.rstrip("/").rsplit("/", 1)[0]
        try:
            storage.check_credentials(path)
            storage.store_for(folder).has_files(folder)
        except Exception as e:
            reason = storage.unreachable_reason(e)
            if reason is None:
                raise
            return f"cannot reach {folder}: {reason}"
        return None
    path = os.path.realpath(path)
    if os.path.isdir(path):
        return "it is a folder; name a file in it"
    if os.path.exists(path) and not os.path.isfile(path):
        # Written as a temp file renamed over it: a FIFO or a device
        # (/dev/stdout) would be replaced by a regular file, not written to.
        return "it is not a regular file (a pipe, device or socket); name a file"
    folder = os.path.dirname(path)
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create files in {folder}"
    return None
