"""What builds that did not finish left in a dataset folder: staging folders, and the lock's state.

A build writes into a hidden ``<output>/<name>/.staging-*`` folder of its
own and deletes it when it ends, however it ends, except when it is killed
(SIGKILL, a lost machine, the OOM killer) or when it fails for dropping too
many files (it keeps the folder's ``errors.jsonl`` for the user to read).
The next build of the dataset deletes such folders, holding the dataset's
lock (`kiln.pipeline.publish.DatasetRoot.clean_stale_staging`). Until then
`kiln inspect` and `kiln verify` name them (`staging_folders`) with whether
a build holds the lock now (`kiln.schemas.dataset_lock.lock_state`): while
one does, a staging folder may be its own.

Plain Python locally (a walk of each folder: `kiln inspect` stays well under a
second); `tf.io.gfile` for URIs, where each file's size and time is one
request, made a few at a time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import TYPE_CHECKING

from kiln.lazy_import import LazyModule
from kiln.schemas.dataset_lock import LockState, lock_state
from kiln.schemas.location import children, exists, is_remote, join, remote_call
from kiln.schemas.metadata import LATEST_FILENAME, METADATA_FILENAME, STAGING_PREFIX

if TYPE_CHECKING:
    import tensorflow as tf
else:  # only for URIs
    tf = LazyModule("tensorflow")

# Requests in flight while the files of a staging folder on an object store are looked at.
_REMOTE_REQUESTS = 16


@dataclasses.dataclass(frozen=True)
class StagingFolder:
    """One staging folder of a dataset.

    Attributes:
      path: The folder.
      num_files: Files in it, at any depth.
      num_bytes: Their total size.
      modified: When a file in it was last written (`time.time()` scale;
        the folder's own time when it is empty).
    """

    path: str
    num_files: int
    num_bytes: int
    modified: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Leftovers:
    """A dataset folder's staging folders and, when there are any, its lock's state."""

    staging: tuple[StagingFolder, ...] = ()
    lock: LockState | None = None

    def to_json(self) -> dict:
        return {
            "staging_folders": [folder.to_json() for folder in self.staging],
            "lock": None if self.lock is None else self.lock.to_json(),
        }


def leftovers(path: str | os.PathLike) -> Leftovers:
    """The staging folders in the dataset folder `path` and, if there are
    any, whether a build holds the dataset's lock. Empty when `path` is a
    version folder (it holds kiln.json) or not a dataset folder (no LATEST).

    Raises:
      MetadataError: naming the path, when its object store cannot be read.
    """
    path = os.fspath(path)
    if not path.endswith("://"):
        path = path.rstrip("/") or "/"
    if exists(join(path, METADATA_FILENAME)) or not exists(join(path, LATEST_FILENAME)):
        return Leftovers()
    names = sorted(name for name in children(path) if name.startswith(STAGING_PREFIX))
    if not names:
        return Leftovers()
    found = [_staging_folder(join(path, name)) for name in names]
    folders = tuple(folder for folder in found if folder is not None)
    return Leftovers(folders, lock_state(path)) if folders else Leftovers()


def _staging_folder(path: str) -> StagingFolder | None:
    """The folder at `path`, or None if it is gone (a build that ended meanwhile)."""
    if is_remote(path):
        return _remote_staging_folder(path)
    try:
        count, size, modified = 0, 0, os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                status = os.stat(os.path.join(folder, name))
            except FileNotFoundError:  # deleted meanwhile (a running build's temp file)
                continue
            count += 1
            size += status.st_size
            modified = max(modified, status.st_mtime)
    return StagingFolder(path, count, size, modified)


def _remote_staging_folder(path: str) -> StagingFolder | None:
    def files() -> list[str]:
        return [join(folder, name) for folder, _, names in tf.io.gfile.walk(path) for name in names]

    def stat(file: str):
        try:
            return tf.io.gfile.stat(file)
        except tf.errors.NotFoundError:  # deleted meanwhile
            return None

    found = remote_call(path, files)
    with concurrent.futures.ThreadPoolExecutor(_REMOTE_REQUESTS) as pool:
        statuses = [s for s in remote_call(path, lambda: list(pool.map(stat, found))) if s]
    if not statuses:  # an object store has no empty folders: gone
        return None
    # mtime_nsec: nanoseconds since the epoch (an object's update time).
    modified = max((s.mtime_nsec / 1e9 for s in statuses), default=0.0)
    return StagingFolder(path, len(statuses), sum(s.length for s in statuses), modified)
