"""The dataset lock's file: who holds it, and whether a build holds it now.

`kiln.pipeline.lock.DatasetLock` takes and keeps the lock for a build; this
module is what the lock file says and how to read it without taking it, so
that `kiln inspect` and `kiln verify` (reader-only installs: no Beam) can
tell whether a staging folder may belong to a build that is running
(`lock_state`).

- **Local disks**: ``<output>/<name>/.lock`` is held with ``flock`` while a
  build runs; the file stays afterwards, naming the last holder.
- **Object stores**: the ``.lock`` object exists while a build holds it; its
  holder rewrites the ``heartbeat`` every 30 seconds, and a lock whose
  heartbeat is older than `STALE_AFTER_SECONDS` belonged to a dead builder.

Plain Python locally; `kiln.schemas.location` (TensorFlow's file system) for
URIs.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import os
import secrets
import socket
import time

from kiln.schemas.location import exists, is_remote, join, read_bytes
from kiln.schemas.metadata import LOCK_FILENAME

# An object store lock whose heartbeat is older than this belonged to a dead
# builder (its holder beats every 30 s): the next build breaks it.
STALE_AFTER_SECONDS = 600.0


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a dataset's lock."""

    pid: int
    host: str
    started: str  # ISO 8601, UTC
    token: str = ""
    heartbeat: float = 0.0  # time.time() of the holder's last sign of life (object stores)
    # Where `pid` names the holder (`process_namespace`); "" if unknown.
    namespace: str = ""

    @classmethod
    def me(cls) -> Holder:
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            token=secrets.token_hex(8),
            heartbeat=time.time(),
            namespace=process_namespace(),
        )

    def to_bytes(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes | None) -> Holder | None:
        try:
            fields = json.loads((data or b"").decode("utf-8"))
            known = {field.name for field in dataclasses.fields(cls)}
            # Fields a later kiln added are ignored, so that it and this one
            # can take turns at a dataset.
            return cls(**{name: value for name, value in fields.items() if name in known})
        except (ValueError, TypeError, AttributeError):  # empty (being written) or not ours
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}"

    def dead_here(self) -> bool:
        """Whether this holder is a process of this machine (same host name)
        and pid namespace (`process_namespace`) that is no longer alive.
        False whenever that cannot be known: another machine or container,
        a lock written by a kiln that did not record its namespace."""
        here = self.host == socket.gethostname() and self.namespace == process_namespace()
        if not here or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False


def process_namespace() -> str:
    """Where a pid names one process: this boot of this machine and this
    process's pid namespace (a container has its own, and may share the
    host's name: ``docker run --network host``). On Linux
    ``<boot id>/pid:[<inode>]``; elsewhere "", where a host name without
    containers of its own is enough."""
    if not os.path.exists("/proc/self/ns/pid"):
        return ""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:  # unknown: equal to no other process's
        return f"unknown {secrets.token_hex(8)}"


def stale_reason(holder: Holder, stale_after: float = STALE_AFTER_SECONDS) -> str | None:
    """Why an object store lock's `holder` is dead (no heartbeat for
    `stale_after` seconds, or a dead process of this machine), or None if it
    may be alive."""
    silent = time.time() - holder.heartbeat
    if silent > stale_after:
        return f"no heartbeat for {silent:.0f} s"
    if holder.dead_here():
        return f"its process {holder.pid} on this machine is not running"
    return None


@dataclasses.dataclass(frozen=True)
class LockState:
    """Whether a build holds a dataset's lock now (`lock_state`).

    Attributes:
      held: True: a build holds it, and may be running. False: none does
        (no lock, a local lock nobody holds, or an object store lock whose
        holder is dead). None: it cannot be told (a local file system
        without ``flock``).
      text: The state in words, naming the holder, e.g. ``held by pid 12
        on host, started 2026-01-01T00:00:00+00:00: a build of the dataset
        is running``.
      holder: Who holds it, or held it last (None: nobody ever, or unreadable).
    """

    held: bool | None
    text: str
    holder: Holder | None = None

    def to_json(self) -> dict:
        return {
            "held": self.held,
            "text": self.text,
            "holder": None if self.holder is None else dataclasses.asdict(self.holder),
        }


def lock_state(dataset_root: str) -> LockState:
    """Whether a build holds the lock of ``<output>/<name>`` now, without taking it.

    Locally the lock file is tried with a shared, non-blocking ``flock``,
    released at once: a build holding it makes the try fail. (A build that
    starts in those microseconds finds the lock busy and exits 3, as with
    any other holder; ``kiln build --wait`` rides over it.) On an object
    store the lock object is read: present and beating is held; a holder
    without a heartbeat for `STALE_AFTER_SECONDS`, or a dead process of
    this machine, is a dead build's lock, which the next build breaks.

    Raises:
      MetadataError: naming the lock, when its object store cannot be read.
    """
    path = join(dataset_root, LOCK_FILENAME)
    if is_remote(path):
        if not exists(path):
            return LockState(False, "no build holds the dataset's lock")
        holder = Holder.from_bytes(read_bytes(path))
        if holder is None:  # being written: someone is taking it
            return LockState(True, "a build is taking the dataset's lock")
        why = stale_reason(holder)
        if why is not None:
            return LockState(
                False,
                f"the dataset's lock is stale ({holder.describe()}; {why}): its build is "
                f"dead, and the next build breaks the lock",
                holder,
            )
        silent = max(0.0, time.time() - holder.heartbeat)
        return LockState(
            True,
            f"a build holds the dataset's lock ({holder.describe()}, last heartbeat "
            f"{silent:.0f} s ago): it may be running",
            holder,
        )
    return _local_lock_state(path)


def _local_lock_state(path: str) -> LockState:
    try:
        import fcntl
    except ImportError:  # not POSIX: flock cannot be tried
        return LockState(None, "whether a build holds the dataset's lock cannot be told here")
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return LockState(False, "no build holds the dataset's lock")
    try:
        holder = Holder.from_bytes(os.pread(fd, 4096, 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            who = f" ({holder.describe()})" if holder is not None else ""
            return LockState(
                True, f"a build of the dataset is running: it holds the lock{who}", holder
            )
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return LockState(False, "no build holds the dataset's lock", holder)
