"""Atomic, versioned publishing of a built dataset, locally and on gs://.

A dataset root ``<output>/<name>/`` holds::

    <version>/              a complete dataset: shards, errors.jsonl, kiln.json
    LATEST                  the name of the version readers should use
    .staging-<stamp>-<rnd>/ a build in progress (never read)
    .stamps/<stamp>         the version an input listing was built into

A build writes everything into its staging folder, `kiln.json` last, then
`publish` moves the folder to ``<version>/`` and replaces LATEST, last of
all. A reader following LATEST therefore never sees a half-written version,
and a build killed at any moment leaves the previous LATEST intact.

Locally the move is one atomic directory rename and LATEST is replaced with
an atomic file rename. Object stores (gs://) have no directories and their
rename is copy-then-delete, so there the files are moved one by one with
`kiln.json` last (a version folder without `kiln.json` is incomplete and
is replaced by the next build), and LATEST is written as a single object
write, which is atomic.
"""

from __future__ import annotations

import logging
import os
import secrets

from apache_beam.io.filesystems import FileSystems

from kiln.pipeline.config import is_remote
from kiln.schemas import LATEST_FILENAME, METADATA_FILENAME, STAGING_PREFIX

logger = logging.getLogger(__name__)

STAMPS_FOLDER = ".stamps"
WORK_FOLDER = ".work"  # inside staging: listing, temp shards, job report


def new_staging_dir(dataset_root: str, stamp: str) -> str:
    """A fresh, unique staging folder name next to the versions."""
    return FileSystems.join(dataset_root, f"{STAGING_PREFIX}{stamp[:12]}-{secrets.token_hex(4)}")


def version_dir(dataset_root: str, version: str) -> str:
    return FileSystems.join(dataset_root, version)


def read_text(path: str) -> str | None:
    """A small file's text, or None if it does not exist."""
    try:
        if not FileSystems.exists(path):
            return None
        with FileSystems.open(path) as f:
            return f.read().decode("utf-8")
    except FileNotFoundError:
        return None


def write_text(path: str, text: str) -> None:
    """Writes a small file atomically: temp + rename locally, one object write remotely."""
    data = text.encode("utf-8")
    if is_remote(path):
        with FileSystems.create(path) as f:
            f.write(data)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.tmp-{secrets.token_hex(4)}"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def is_complete(directory: str) -> bool:
    """Whether a version folder holds a complete dataset (its kiln.json)."""
    return FileSystems.exists(FileSystems.join(directory, METADATA_FILENAME))


def latest_version(dataset_root: str) -> str | None:
    """The version LATEST names, or None."""
    text = read_text(FileSystems.join(dataset_root, LATEST_FILENAME))
    if text is None or not text.strip():
        return None
    return text.strip()


def stamped_version(dataset_root: str, stamp: str) -> str | None:
    """The complete version this input stamp was built into, or None."""
    text = read_text(FileSystems.join(dataset_root, STAMPS_FOLDER, stamp))
    if not text or not text.strip():
        return None
    version = text.strip()
    return version if is_complete(version_dir(dataset_root, version)) else None


def point_latest(dataset_root: str, version: str) -> None:
    """Makes LATEST name `version` (atomically; see the module docstring)."""
    write_text(FileSystems.join(dataset_root, LATEST_FILENAME), version)


def record_stamp(dataset_root: str, stamp: str, version: str) -> None:
    write_text(FileSystems.join(dataset_root, STAMPS_FOLDER, stamp), version)


def delete_tree(path: str) -> None:
    """Deletes a folder and everything in it, if it exists."""
    if not is_remote(path):
        if os.path.lexists(path):
            FileSystems.delete([path])
        return
    files = [m.path for m in FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list]
    if files:
        FileSystems.delete(files)


def stale_staging_dirs(dataset_root: str) -> list[str]:
    """Staging folders of builds that did not finish (or are running)."""
    prefix = FileSystems.join(dataset_root, STAGING_PREFIX)
    if not is_remote(dataset_root):
        if not os.path.isdir(dataset_root):
            return []
        return sorted(os.path.join(dataset_root, entry) for entry in os.listdir(dataset_root)
                      if entry.startswith(STAGING_PREFIX))
    found = set()
    for metadata in FileSystems.match([prefix + "*/**"])[0].metadata_list:
        relative = metadata.path[len(dataset_root.rstrip("/")) + 1:]
        found.add(FileSystems.join(dataset_root, relative.split("/", 1)[0]))
    return sorted(found)


def clean_stale_staging(dataset_root: str) -> list[str]:
    """Deletes the staging folders a killed or failed build left behind.

    Builds of one dataset must not run at the same time: this would delete
    the other build's staging folder.
    """
    stale = stale_staging_dirs(dataset_root)
    for directory in stale:
        logger.info("deleting the stale staging folder %s", directory)
        delete_tree(directory)
    return stale


def move_into_place(staging: str, target: str) -> None:
    """Moves a finished staging folder to its version folder, kiln.json last."""
    if FileSystems.exists(target) or (is_remote(target) and _has_files(target)):
        # An incomplete version folder (a copy interrupted on an object
        # store); a complete one never reaches here.
        delete_tree(target)
    if not is_remote(staging):
        os.rename(staging, target)  # atomic
        return
    root = staging.rstrip("/")
    files = sorted(m.path for m in FileSystems.match([root + "/**"])[0].metadata_list)
    metadata = [f for f in files if f.endswith("/" + METADATA_FILENAME)
                and f[len(root) + 1:] == METADATA_FILENAME]
    others = [f for f in files if f not in metadata]
    for group in (others, metadata):
        if group:
            FileSystems.rename(group, [target.rstrip("/") + f[len(root):] for f in group])
    delete_tree(staging)


def _has_files(directory: str) -> bool:
    return bool(FileSystems.match([directory.rstrip("/") + "/**"], limits=[1])[0].metadata_list)
