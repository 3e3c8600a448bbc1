"""Atomic, versioned publishing of a built dataset, locally and on gs://.

A dataset root ``<output>/<name>/`` holds::

    <version>/              a complete dataset: shards, errors.jsonl, kiln.json
    LATEST                  the name of the version readers should use
    .staging-<stamp>-<rnd>/ a build in progress (never read)
    .stamps/<stamp>         the version an input listing was built into
    .published/<version>    when LATEST last named the version (a sequence
                            number), so `prune_versions` keeps the newest

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

Small files (LATEST, stamps) are written to a hidden temp name and renamed
locally; a build killed in between leaves a ``.LATEST.tmp-*`` file that the
next build deletes with the stale staging folders.
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
PUBLISHED_FOLDER = ".published"
_TEMP_MARK = ".tmp-"
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
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{name}{_TEMP_MARK}{secrets.token_hex(4)}")  # hidden
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
    """Deletes what a killed or failed build left behind: its staging folder,
    and temp files of small writes it did not finish (local only).

    Builds of one dataset must not run at the same time: this would delete
    the other build's staging folder.
    """
    stale = stale_staging_dirs(dataset_root)
    for directory in stale:
        logger.info("deleting the stale staging folder %s", directory)
        delete_tree(directory)
    if not is_remote(dataset_root):
        for folder in (dataset_root, os.path.join(dataset_root, STAMPS_FOLDER),
                       os.path.join(dataset_root, PUBLISHED_FOLDER)):
            if not os.path.isdir(folder):
                continue
            for entry in sorted(os.listdir(folder)):
                if entry.startswith(".") and _TEMP_MARK in entry:
                    stale.append(os.path.join(folder, entry))
                    os.remove(stale[-1])
    return stale


def versions(dataset_root: str) -> list[str]:
    """Names of the version folders under a dataset root, complete or not, sorted."""
    if not is_remote(dataset_root):
        if not os.path.isdir(dataset_root):
            return []
        return sorted(entry for entry in os.listdir(dataset_root)
                      if not entry.startswith(".")
                      and os.path.isdir(os.path.join(dataset_root, entry)))
    root = dataset_root.rstrip("/")
    found = set()
    for metadata in FileSystems.match([root + "/*/**"])[0].metadata_list:
        first = metadata.path[len(root) + 1:].split("/", 1)[0]
        if not first.startswith("."):
            found.add(first)
    return sorted(found)


def record_published(dataset_root: str, version: str) -> None:
    """Notes that LATEST is about to name `version`: the newest publication.

    A sequence number rather than a clock time, so machines with skewed
    clocks (a laptop, then a scheduler) still order publications right.
    """
    marks = _published_marks(dataset_root)
    write_text(FileSystems.join(dataset_root, PUBLISHED_FOLDER, version),
               f"{max(marks.values(), default=0) + 1}\n")


def _small_files(folder: str) -> dict[str, str]:
    """Path -> text of every file directly in `folder` (temp files left out)."""
    if is_remote(folder):
        paths = [m.path for m in FileSystems.match([folder.rstrip("/") + "/*"])[0].metadata_list]
    elif os.path.isdir(folder):
        paths = [os.path.join(folder, entry) for entry in os.listdir(folder)
                 if not entry.startswith(".")]
    else:
        paths = []
    return {path: (read_text(path) or "").strip() for path in sorted(paths)}


def _published_marks(dataset_root: str) -> dict[str, int]:
    """Version -> its publication's sequence number."""
    return {path.rstrip("/").rsplit("/", 1)[-1]: int(text)
            for path, text in _small_files(FileSystems.join(dataset_root, PUBLISHED_FOLDER)).items()
            if text.isdigit()}


def prune_versions(dataset_root: str, keep: int) -> list[str]:
    """Deletes all but the `keep` most recently published complete versions,
    never the one LATEST names. Returns the pruned version names.

    Recency is the order in which LATEST named them (`record_published`);
    versions published before kiln recorded it count as older than any that
    has a record, among themselves ordered by their kiln.json's time. Each
    version loses its kiln.json first, so a reader resolving it during the
    deletion gets "incomplete" rather than a missing shard. Folders without
    kiln.json are left alone: invisible to readers, and replaced by the next
    build of that version.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    latest = latest_version(dataset_root)
    marks = _published_marks(dataset_root)
    complete = [v for v in versions(dataset_root) if is_complete(version_dir(dataset_root, v))]

    def recency(version: str):
        if version in marks:
            return (1, marks[version], version)
        metadata_path = FileSystems.join(version_dir(dataset_root, version), METADATA_FILENAME)
        return (0, FileSystems.match([metadata_path])[0].metadata_list[0].last_updated_in_seconds,
                version)

    newest_first = sorted(complete, key=recency, reverse=True)
    kept = set(newest_first[:keep]) | ({latest} if latest else set())
    pruned = [v for v in newest_first if v not in kept]
    if not pruned:
        return []
    stamps = _small_files(FileSystems.join(dataset_root, STAMPS_FOLDER))  # path -> version
    for version in pruned:
        logger.info("pruning version %s", version)
        directory = version_dir(dataset_root, version)
        FileSystems.delete([FileSystems.join(directory, METADATA_FILENAME)])
        delete_tree(directory)
        for path, stamped in stamps.items():
            if stamped == version:
                FileSystems.delete([path])
        marker = FileSystems.join(dataset_root, PUBLISHED_FOLDER, version)
        if FileSystems.exists(marker):
            FileSystems.delete([marker])
    return pruned



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
