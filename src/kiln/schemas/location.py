"""Where a dataset version is: `locate` follows LATEST to the version folder.

The reader (`kiln.reader.locate`, `kiln.reader.info`), `kiln inspect` and
`kiln diff` (`kiln.schemas.version_diff`) all accept a version folder or the
dataset's folder ``<output>/<name>``, and find the version the same way.
Their few small files (LATEST, kiln.json, the reports) are read with plain
Python locally and through `tf.io.gfile` for URIs (``gs://...``), which
imports TensorFlow only on that first remote read: so `kiln inspect DATASET`
answers without paying for TensorFlow's import.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, TypeVar

from kiln.lazy_import import LazyModule
from kiln.schemas.metadata import (
    ERRORS_FILENAME,
    LATEST_FILENAME,
    LOCK_FILENAME,
    METADATA_FILENAME,
    STAGING_PREFIX,
    MetadataError,
)

if TYPE_CHECKING:
    import tensorflow as tf
else:  # only for URIs: local files are read with plain Python
    tf = LazyModule("tensorflow")

T = TypeVar("T")

# Bytes `tf.data.TFRecordDataset` buffers per open shard (its ``buffer_size``,
# given by every kiln reader of shards: `read_buffer_bytes`). On local disk
# TF's own default, 256 KiB: a refill is a cheap system call. On an object
# store each refill is a ranged request that waits tens of milliseconds
# before its first byte, so small refills spend most of their time waiting;
# 16 MiB keeps that wait a small share of each transfer, and the reader,
# which opens at most 16 shards at a time per input pipeline, holds at most
# 256 MiB of them. (TF itself raises an unspecified buffer to 127 MiB per
# file for S3, and for GCS on Cloud TPU hosts.)
LOCAL_READ_BUFFER_BYTES = 256 * 1024
REMOTE_READ_BUFFER_BYTES = 16 * 1024 * 1024


# A version folder's name: the first hex digits of the hash of what was
# built (`kiln.pipeline.versioning.version_name`); 48 bits, no collision
# among a dataset's versions.
VERSION_LENGTH = 12
_VERSION_NAME = re.compile(f"[0-9a-f]{{{VERSION_LENGTH}}}")


def is_version_name(name: str) -> bool:
    """Whether `name` has the shape of a version: what a build may delete as
    an incomplete version folder, never a folder a user made."""
    return _VERSION_NAME.fullmatch(name) is not None


def is_remote(path: str) -> bool:
    """True for URIs (``gs://bucket/...``), False for local paths."""
    return "://" in path


def read_buffer_bytes(path: str) -> int:
    """The ``buffer_size`` for `tf.data.TFRecordDataset` reading the shard at `path`."""
    return REMOTE_READ_BUFFER_BYTES if is_remote(path) else LOCAL_READ_BUFFER_BYTES


def join(directory: str, name: str) -> str:
    # gs:// paths take forward slashes on every OS.
    if is_remote(directory):
        return posixpath.join(directory, name)
    return os.path.join(directory, name)


def exists(path: str) -> bool:
    """Whether a file or folder exists at `path`.

    Raises:
      MetadataError: naming `path`, when its object store cannot be reached
        (no network, no credentials, no such bucket).
    """
    if is_remote(path):
        return bool(remote_call(path, lambda: tf.io.gfile.exists(path)))
    return os.path.exists(path)


def read_bytes(path: str) -> bytes:
    """The bytes of the file at `path`.

    Raises:
      OSError: locally. MetadataError: for a URI that cannot be read.
    """
    with open_file(path, "rb") as f:
        return remote_call(path, f.read) if is_remote(path) else f.read()


def read_text(path: str) -> str:
    """The text of the file at `path` (UTF-8: `decode_text`).

    Raises:
      MetadataError: naming `path`, when it is not UTF-8 text (a damaged
        kiln.json), or, for a URI, it cannot be read.
      OSError: locally.
    """
    return decode_text(read_bytes(path), path)


def decode_text(data: bytes, path: str) -> str:
    """`data`, the bytes of one of a dataset's small files (kiln.json, a
    report), as text.

    Raises:
      MetadataError: ``<path>: not UTF-8 text (byte 0xff at position 10)``,
        rather than Python's UnicodeDecodeError, which names neither the
        file nor what kind of problem it is.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetadataError(
            f"{path}: not UTF-8 text (byte {data[e.start]:#04x} at position {e.start})"
        ) from None


def read_latest(path: str) -> str:
    """The version the LATEST file at `path` names (stripped; may be empty).

    Raises:
      MetadataError: naming `path`, when it is not UTF-8 text (a damaged
        file, a bad rollback by hand), a folder (a rollback by hand that
        made LATEST a symbolic link to the version folder), or its object
        store cannot be read.
      OSError: locally.
    """
    try:
        data = read_bytes(path)
    except IsADirectoryError:
        raise MetadataError(
            f"{path} is a folder (or a symbolic link to one), not a file naming a version "
            f"folder; write the version's name into it"
        ) from None
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise MetadataError(
            f"{path} is not text (byte {data[e.start]:#04x} at position {e.start} is not "
            f"UTF-8); it should name a version folder"
        ) from None


def open_file(path: str, mode: str = "r") -> IO[Any]:
    """The file at `path`, open for reading (``"r"``: UTF-8 text, ``"rb"``: bytes).

    Raises:
      OSError: locally. MetadataError: for a URI that cannot be opened.
    """
    if is_remote(path):
        return remote_call(path, lambda: tf.io.gfile.GFile(path, mode))
    return open(path, mode, encoding=None if "b" in mode else "utf-8")


# TensorFlow's words for a URI scheme it has no filesystem for (s3:// since
# TensorFlow moved that filesystem to tensorflow-io).
_NO_FILESYSTEM = re.compile(r"scheme '(?P<scheme>[^']+)' not implemented")


def remote_call(path: str, operation: Callable[[], T]) -> T:
    """`operation()` on an object store (through `tf.io.gfile`), its failure
    as a `MetadataError`: one line naming `path`, in kiln's words when this
    TensorFlow has no filesystem for its scheme (`_no_filesystem`)."""
    try:
        return operation()
    except tf.errors.OpError as e:
        reason = next((line.strip() for line in str(e.message).splitlines() if line.strip()), "")
        unsupported = _NO_FILESYSTEM.search(reason)
        if isinstance(e, tf.errors.UnimplementedError) and unsupported:
            raise MetadataError(_no_filesystem(path, unsupported["scheme"])) from None
        raise MetadataError(f"{path}: cannot read it: {reason or type(e).__name__}") from None


def _no_filesystem(path: str, scheme: str) -> str:
    """Why the dataset at `path` cannot be read: this TensorFlow, which
    kiln reads datasets with, has no filesystem for `scheme` (s3:// in
    TensorFlow 2.21; tensorflow-io's would add it), and what to do instead
    (docs/dataflow.md, "S3")."""
    copy = "e.g. aws s3 sync s3://.../<name>/<version> ./<version>, " if scheme == "s3" else ""
    return (
        f"{path}: cannot read {scheme}:// paths: this TensorFlow has no {scheme}:// "
        f"filesystem, and kiln reads datasets through TensorFlow; copy the version folder "
        f"to local disk or gs:// first ({copy}then read the copy; docs/dataflow.md)"
    )


def locate(path: str | os.PathLike) -> str:
    """The dataset version folder for `path` (as given: relative if `path` is;
    the reader's `kiln.reader.locate` makes it absolute).

    Args:
      path: A version folder written by `kiln build` (it contains
        `kiln.json`), or the dataset's folder ``<output>/<name>`` whose
        `LATEST` file names the newest version folder. Local or ``gs://``.
        LATEST is read with or without a trailing newline.

    Raises:
      MetadataError: naming the path, when neither holds; for an empty path
        (an unset variable), which would otherwise be looked for at ``/``.
      TypeError: for a path that is not a str or `os.PathLike` (None).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"a dataset path must be a str or os.PathLike (a local folder or a gs:// URI), "
            f"got {type(path).__name__} {path!r}"
        )
    path = os.fspath(path)
    if not path:
        raise MetadataError(
            "the dataset path is empty (an unset variable?): pass the folder `kiln build` "
            "wrote (<output>/<name>/<version>) or its parent <output>/<name>"
        )
    if not path.endswith("://"):
        path = path.rstrip("/") or "/"
    if exists(join(path, METADATA_FILENAME)):
        return path
    latest = join(path, LATEST_FILENAME)
    if exists(latest):
        version = read_latest(latest)
        if not version:
            raise MetadataError(f"{latest} is empty; it should name a version folder")
        absolute = is_remote(version) or os.path.isabs(version)
        version_dir = version if absolute else join(path, version)
        if not exists(join(version_dir, METADATA_FILENAME)):
            raise MetadataError(
                f"{latest} names version {version!r}, but {version_dir} has no "
                f"{METADATA_FILENAME} (the build did not finish, or the folder was removed)"
            )
        return version_dir
    if not exists(path):
        raise MetadataError(f"{path}: no such dataset folder")
    if not _is_dir(path):
        raise MetadataError(_file_passed_message(path))
    message = (
        f"{path} is not a kiln dataset: it has no {METADATA_FILENAME} and no {LATEST_FILENAME} "
        f"naming a version folder."
    )
    parent, name = (posixpath if is_remote(path) else os.path).split(path)
    if is_version_name(name) and exists(join(parent, LATEST_FILENAME)):
        raise MetadataError(
            f"{message} It is an incomplete version folder of the dataset {parent} (left by an "
            f"interrupted build or prune; the next kiln build deletes it): pass {parent}, "
            f"whose LATEST names its newest version."
        )
    unpublished = _unpublished_message(path)
    if unpublished:
        raise MetadataError(unpublished)
    datasets = [] if is_remote(path) else _datasets_in(path)
    if datasets:  # the config's `output`, which holds a folder per dataset
        shown = ", ".join(join(path, name) for name in datasets[:_DATASETS_SHOWN])
        hidden = len(datasets) - _DATASETS_SHOWN
        more = f" and {hidden} more" if hidden > 0 else ""
        raise MetadataError(
            f"{message} It is an output folder holding {len(datasets)} dataset(s): pass one: "
            f"{shown}{more}."
        )
    raise MetadataError(
        f"{message} Pass the folder `kiln build` wrote (<output>/<name>/<version>) or its "
        f"parent <output>/<name>."
    )


def _unpublished_message(path: str) -> str | None:
    """What `locate` says of a dataset folder whose builds have not published a
    version yet (it holds a build's lock or staging folders but no LATEST), or
    None when `path` is not one."""
    names = children(path)
    staging = sorted(name for name in names if name.startswith(STAGING_PREFIX))
    if not staging and LOCK_FILENAME not in names:
        return None
    message = (
        f"{path} is a dataset folder with no published version yet: no build of it has "
        f"finished (one may be running now, or they failed)."
    )
    reports = [join(join(path, name), ERRORS_FILENAME) for name in staging]
    kept = [report for report in reports if exists(report)]
    if kept:
        newest = kept[-1] if is_remote(path) else max(kept, key=os.path.getmtime)
        message += f" A failed build's error report is {newest}."
    return message


# How many datasets `locate` names when given the folder that holds them.
_DATASETS_SHOWN = 5


def _datasets_in(folder: str) -> list[str]:
    """The names of the local `folder`'s subfolders that are dataset folders
    (they hold a LATEST file), sorted."""
    try:
        with os.scandir(folder) as found:
            entries = sorted(found, key=lambda entry: entry.name)
    except OSError:
        return []
    return [
        entry.name
        for entry in entries
        if not entry.name.startswith(".")
        and entry.is_dir()
        and os.path.isfile(os.path.join(entry.path, LATEST_FILENAME))
    ]


def incomplete_versions(path: str | os.PathLike) -> list[str]:
    """The incomplete version folders of the dataset folder `path`, sorted.

    Named like a version, without kiln.json, and not the version LATEST
    names: what a build killed while it copied its version to an object
    store, or a ``--keep`` prune stopped half-way, leaves. No reader uses
    such a folder, and the next `kiln build` of the dataset deletes it
    (`kiln.pipeline.publish.DatasetRoot.clean_incomplete_versions`, the
    same rule). Empty when `path` is a version folder (it holds kiln.json)
    or holds no LATEST.

    Raises:
      MetadataError: naming `path`, when its object store cannot be reached.
    """
    path = os.fspath(path)
    if not path.endswith("://"):
        path = path.rstrip("/") or "/"
    latest = join(path, LATEST_FILENAME)
    if exists(join(path, METADATA_FILENAME)) or not exists(latest):
        return []
    named = read_latest(latest)
    names = children(path)
    return [
        join(path, name)
        for name in sorted(set(names))
        if is_version_name(name)
        and name != named
        and not exists(join(join(path, name), METADATA_FILENAME))
    ]


def children(path: str) -> list[str]:
    """The names of what the folder `path` holds (files and folders, no
    trailing slash), in no particular order.

    Raises:
      OSError: locally. MetadataError: for a URI that cannot be listed.
    """
    if is_remote(path):
        return [n.rstrip("/") for n in remote_call(path, lambda: tf.io.gfile.listdir(path))]
    return os.listdir(path)


def _is_dir(path: str) -> bool:
    """Whether the existing `path` is a folder (object stores: a prefix with objects under it)."""
    if is_remote(path):
        return bool(remote_call(path, lambda: tf.io.gfile.isdir(path)))
    return os.path.isdir(path)


def _file_passed_message(path: str) -> str:
    """What `locate` says when given a file (kiln.json, a shard, LATEST) instead of a folder."""
    parent = posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)
    if os.path.basename(path) == LATEST_FILENAME:
        here = f" ({parent})" if parent and exists(path) else ""
        return (
            f"{path} is the dataset's {LATEST_FILENAME} file, not a dataset folder. Pass the "
            f"folder that holds it{here}, which follows it to the newest version, or a version "
            f"folder (the folder that holds {METADATA_FILENAME})."
        )
    holding = parent if parent and exists(join(parent, METADATA_FILENAME)) else None
    what = (
        f"the dataset's {METADATA_FILENAME} file"
        if os.path.basename(path) == METADATA_FILENAME
        else "a file"
    )
    instead = f" (here: {holding})" if holding else ""
    return (
        f"{path} is {what}, not a dataset folder. Pass the folder that holds "
        f"{METADATA_FILENAME}{instead}, or the dataset's folder <output>/<name> whose "
        f"{LATEST_FILENAME} names its newest version."
    )
