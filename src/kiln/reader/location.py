"""Where a dataset is and what its kiln.json says: `locate` and `info`, without TensorFlow locally.

`kiln inspect` and the first step of every read need only a few small
files (LATEST, kiln.json, errors.jsonl). Local paths are read with plain
Python; URIs (``gs://...``) through `tf.io.gfile`, which imports TensorFlow
on that first remote read. So `kiln inspect DATASET` answers in well under a
second instead of paying for TensorFlow's import.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import kiln
from kiln.lazy_import import LazyModule
from kiln.schemas import LATEST_FILENAME, METADATA_FILENAME, DatasetInfo, MetadataError, schema_for

if TYPE_CHECKING:
    import tensorflow as tf
else:  # only for URIs: local files are read with plain Python
    tf = LazyModule("tensorflow")

T = TypeVar("T")


def is_remote(path: str) -> bool:
    """True for URIs (``gs://bucket/...``), False for local paths."""
    return "://" in path


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
        return bool(_remote(path, lambda: tf.io.gfile.exists(path)))
    return os.path.exists(path)


def read_text(path: str) -> str:
    """The text of the file at `path` (UTF-8).

    Raises:
      OSError: locally. MetadataError: for a URI that cannot be read.
    """
    if is_remote(path):

        def read() -> str:
            with tf.io.gfile.GFile(path, "r") as f:
                return f.read()

        return _remote(path, read)
    with open(path, encoding="utf-8") as f:
        return f.read()


def _remote(path: str, operation: Callable[[], T]) -> T:
    """`operation()` on an object store, its failure as one line naming `path`."""
    try:
        return operation()
    except tf.errors.OpError as e:
        reason = next((line.strip() for line in str(e.message).splitlines() if line.strip()), "")
        raise MetadataError(f"{path}: cannot read it: {reason or type(e).__name__}") from None


def locate(path: str | os.PathLike) -> str:
    """The dataset version folder for `path`.

    Args:
      path: A version folder written by `kiln build` (it contains
        `kiln.json`), or the dataset's folder ``<output>/<name>`` whose
        `LATEST` file names the newest version folder. Local or ``gs://``.
        LATEST is read with or without a trailing newline.

    Raises:
      MetadataError: naming the path, when neither holds.
    """
    path = os.fspath(path)
    if not path.endswith("://"):
        path = path.rstrip("/") or "/"
    if exists(join(path, METADATA_FILENAME)):
        return path
    latest = join(path, LATEST_FILENAME)
    if exists(latest):
        version = read_text(latest).strip()
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
    raise MetadataError(
        f"{path} is not a kiln dataset: it has no {METADATA_FILENAME} and no {LATEST_FILENAME} "
        f"naming a version folder. Pass the folder `kiln build` wrote "
        f"(<output>/<name>/<version>) or its parent <output>/<name>."
    )


def info(path: str | os.PathLike) -> DatasetInfo:
    """The metadata of the dataset at `path` (splits, counts, class names, statistics, schema).

    Reads `kiln.json` only; builds no dataset. `path` is resolved as in `locate`.

    The metadata is checked as far as kiln.json alone allows: from format
    version 2 it records a checksum of its own content, and a file edited
    after the build wrote it (a statistics mean, the augment list, a count,
    a shard's sha256...) is refused. Older formats have no checksum and load
    unchecked. The shards are not read: `kiln verify` checks them.

    Raises:
      MetadataError: naming the file, if it is missing, malformed, modified
        after it was written (`kiln.schemas.MetadataChecksumError`), written
        by a newer kiln, or declares a record schema this reader cannot parse.
    """
    dataset_dir = locate(path)
    source = join(dataset_dir, METADATA_FILENAME)
    metadata = DatasetInfo.loads(read_text(source), source=source)
    if metadata.format_version > kiln.FORMAT_VERSION:
        raise MetadataError(
            f"{source}: written with format version {metadata.format_version} by kiln "
            f"{metadata.kiln_version}; this kiln ({kiln.__version__}) reads up to "
            f"{kiln.FORMAT_VERSION}. Upgrade kiln."
        )
    stored = {f["name"]: (f["key"], f["dtype"]) for f in metadata.schema.get("features", [])}
    expected = {f.name: (f.key, f.dtype) for f in schema_for(metadata.targets_config).features}
    if stored != expected:
        differing = sorted(
            name for name in set(stored) | set(expected) if stored.get(name) != expected.get(name)
        )
        raise MetadataError(
            f"{source}: the stored record schema differs from this kiln's in feature(s) "
            f"{differing}; read it with the kiln version that wrote it ({metadata.kiln_version})"
        )
    return metadata
