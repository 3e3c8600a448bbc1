"""The dataset lock: builds of one dataset exclude each other.

A scheduler that fires twice, or a rebuild started by hand while the nightly
one runs, must not produce two builds of ``<output>/<name>`` at once: each
would clean the other's staging folder and race to replace LATEST. `build`
holds `DatasetLock` from before it lists the source until it has published
(or found the dataset up to date); a second build either waits for it
(``kiln build --wait SECONDS``) or stops at once with `kiln.errors.Busy`
(exit 3), naming the build that holds the lock.

- **Local disks**: ``<output>/<name>/.lock`` is locked with ``flock``. The
  kernel releases the lock when its holder exits, however it exits (SIGKILL
  and power loss included), so a dead builder never leaves a stale lock. The
  file stays; its content names the last holder (pid, host, start time). A
  lock file deleted or replaced while its holder runs lets the next build
  lock another file of that name: the holder checks that the path still
  names its file (`DatasetLock.check`).
- **Object stores**: the ``.lock`` object is created only if it does not
  exist (a GCS ``ifGenerationMatch=0`` create, `storage.Store.create_exclusive`),
  and deleted on release. A builder that dies cannot delete it, so the holder
  rewrites its ``heartbeat`` every `HEARTBEAT_SECONDS`; a lock whose heartbeat
  is older than `STALE_AFTER_SECONDS` belonged to a dead builder and is
  broken by the next one (logged). Breaking it and every heartbeat replace
  the object only if it still holds what was read
  (`storage.Store.replace_if_unchanged`): two builds breaking one stale lock
  take it once, and a holder that stalled past the limit stops beating
  instead of writing its lock back over the new holder's. A builder on the
  same machine need not wait that long: the lock names the holder's pid,
  host and pid namespace (`Holder.namespace`), and where all three are this
  process's, a pid that is not alive is a dead holder, whose lock is broken
  at once (logged).
  Before publishing, the holder checks that the lock is still its own
  (`DatasetLock.check`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import threading
import time
import types

from kiln.errors import Busy, Failure, UsageError
from kiln.pipeline import storage
from kiln.schemas.dataset_lock import LOCK_FILENAME, STALE_AFTER_SECONDS, Holder, stale_reason

__all__ = ["HEARTBEAT_SECONDS", "LOCK_FILENAME", "STALE_AFTER_SECONDS", "DatasetLock", "Holder"]

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0
_POLL_SECONDS = 0.5


def _describe(holder: Holder | None) -> str:
    return "nobody" if holder is None else holder.describe()


def _stale(holder: Holder) -> str | None:
    """Why an object store lock's `holder` is dead, or None if it may be alive."""
    return stale_reason(holder, STALE_AFTER_SECONDS)


class DatasetLock:
    """Holds a dataset's lock for a build (a context manager).

    Args:
      dataset_root: ``<output>/<name>``.
      wait: Seconds to wait for another build to finish; 0 fails at once.

    Raises (on entering):
      Busy: another build holds the lock (after waiting `wait` seconds).
      UsageError: the object store holding the dataset cannot be reached
        (no credentials, no network, access denied, no such bucket).
    """

    def __init__(self, dataset_root: str, *, wait: float = 0.0):
        self.path = storage.join(dataset_root, LOCK_FILENAME)
        self._wait = wait
        self._me = Holder.me()
        self._remote = storage.is_remote(dataset_root)
        self._fd: int | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> DatasetLock:
        deadline = time.monotonic() + self._wait
        while not self._try_acquire():
            if time.monotonic() >= deadline:
                raise Busy(self._busy_message(self._current_holder()))
            time.sleep(_POLL_SECONDS)
        logger.info("locked %s", self.path)
        return self

    def _busy_message(self, holder: Holder | None) -> str:
        dataset = os.path.dirname(self.path)
        waited = f" after waiting {self._wait:g} s" if self._wait else ""
        then = f"; nothing was done{waited} (kiln build --wait SECONDS waits for it)"
        if not self._remote:  # flock: its holder is alive
            who = f" ({holder.describe()})" if holder else ""
            return f"another build of {dataset} is running{who}{then}"
        # An object: whether its holder is alive is not known, only when it
        # last said so.
        if holder is None:
            return f"another build holds the lock of {dataset}{then}"
        silent = max(0.0, time.time() - holder.heartbeat)
        return (
            f"another build holds the lock of {dataset} ({holder.describe()}, last "
            f"heartbeat {silent:.0f} s ago; broken after {STALE_AFTER_SECONDS:.0f} s "
            f"without one){then}"
        )

    def holder(self) -> Holder | None:
        """Who holds the lock now (or held it last, on a local disk)."""
        return Holder.from_bytes(storage.store_for(self.path).read_bytes(self.path))

    def _current_holder(self) -> Holder | None:
        """`holder`, read again for a moment if it is being written."""
        for _ in range(10):
            holder = self.holder()
            if holder is not None:
                return holder
            time.sleep(0.05)
        return None

    def check(self) -> None:
        """Raises `Failure` if this build no longer holds the lock (an object
        store lock broken as stale while this build was stalled; a local
        lock file deleted or replaced while it ran)."""
        if not self._remote:
            # flock cannot be taken away from a live process, but the file
            # can: `rm .lock` (clearing a "stale" lock by hand, a cleanup
            # job) lets the next build lock a new file of that name and run
            # beside this one, deleting its staging folder as stale, or
            # publishing before it does: this one's LATEST would then
            # replace a newer build's.
            if self._fd is not None and not self._same_file(self._fd):
                raise Failure(
                    f"lost the lock {self.path}: the file was deleted or replaced while this "
                    f"build held it, so another build may have run beside it; nothing was "
                    f"published (the lock file is kiln's: never delete it, a dead build's "
                    f"lock is released by the kernel)"
                )
            return
        holder = self.holder()
        if holder is None or holder.token != self._me.token:
            raise Failure(
                f"lost the lock {self.path} to "
                f"{holder.describe() if holder else 'nobody'}; nothing was published"
            )

    def _try_acquire(self) -> bool:
        if not self._remote:
            return self._try_flock()
        try:
            return self._try_object_lock()
        except Exception as e:
            # The build's first access to its output: a store it cannot
            # reach (no credentials, no network, no such bucket) is a usage
            # error, as for `kiln inspect`, not a crash.
            reason = storage.unreachable_reason(e)
            if reason is None:
                raise
            raise UsageError(
                f"{os.path.dirname(self.path)}: cannot reach it: {reason}; nothing was done"
            ) from e

    def _try_flock(self) -> bool:
        import fcntl  # POSIX only; imported here so the module loads everywhere

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        if not self._same_file(fd):
            # Deleted or replaced between the open and the flock (by a
            # holder's `rm`): a lock of a file no other build opens. The
            # file now at the path is the one to lock.
            os.close(fd)
            return self._try_flock()
        # Overwrite in place, then cut what the last holder left beyond it:
        # the file is never empty while a waiting build reads who holds it.
        data = self._me.to_bytes()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        self._fd = fd
        return True

    def _same_file(self, fd: int) -> bool:
        """Whether the lock's path still names the file `fd` has open."""
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        opened = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)

    def _try_object_lock(self) -> bool:
        store = storage.store_for(self.path)
        if not store.create_exclusive(self.path, self._me.to_bytes()):
            stale = store.read_bytes(self.path)
            holder = Holder.from_bytes(stale)
            why = None if holder is None else _stale(holder)
            if stale is None or holder is None or why is None:
                return False
            logger.warning(
                "breaking the stale lock %s of %s: %s", self.path, holder.describe(), why
            )
            # Replaced only if it is still the stale lock read: another build
            # breaking it at the same time (or the holder's late heartbeat)
            # wins or loses as a whole, never deletes a lock just taken.
            if not store.replace_if_unchanged(self.path, stale, self._me.to_bytes()):
                return False
        holder = self.holder()  # read back: a store without preconditions may race
        if holder is None or holder.token != self._me.token:
            return False
        self._start_heartbeat()
        return True

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            store = storage.store_for(self.path)
            while not self._stop.wait(HEARTBEAT_SECONDS):
                beating = dataclasses.replace(self._me, heartbeat=time.time())
                try:
                    # Only over this build's own lock: a build stalled past
                    # STALE_AFTER_SECONDS whose lock was broken must not
                    # write it back over the new holder's (`check` fails it).
                    kept = store.replace_if_unchanged(
                        self.path, self._me.to_bytes(), beating.to_bytes()
                    )
                except Exception as e:  # a missed beat is retried next time
                    logger.debug("missed a heartbeat of the lock %s: %s", self.path, e)
                    continue
                if not kept:
                    with contextlib.suppress(Exception):
                        logger.warning(
                            "lost the lock %s to %s", self.path, _describe(self.holder())
                        )
                    return
                self._me = beating

        self._heartbeat = threading.Thread(target=beat, name="kiln-lock-heartbeat", daemon=True)
        self._heartbeat.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        holder = self.holder()
        if holder is not None and holder.token == self._me.token:
            storage.store_for(self.path).delete([self.path])
