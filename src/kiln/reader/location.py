"""What a dataset's kiln.json says: `info`, after `locate` (`kiln.schemas.location`).

`kiln inspect` and the first step of every read need only a few small
files (LATEST, kiln.json, errors.jsonl), read with plain Python locally and
through `tf.io.gfile` for URIs, so `kiln inspect DATASET` answers in well
under a second instead of paying for TensorFlow's import.
"""

from __future__ import annotations

import os

import kiln
from kiln.schemas import METADATA_FILENAME, DatasetInfo, MetadataError, location, schema_for
from kiln.schemas.location import is_remote, join, read_text

__all__ = ["info", "locate"]


def locate(path: str | os.PathLike) -> str:
    """The dataset version folder for `path` (`kiln.schemas.location.locate`:
    a version folder, or ``<output>/<name>`` whose LATEST names one), made
    absolute if local: it goes into the reader's graph, which a tf.data
    service worker in another working directory runs, and beside checkpoints.

    Raises:
      MetadataError: naming the path, when it holds no dataset.
    """
    found = location.locate(path)
    return found if is_remote(found) else os.path.abspath(found)


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
        by a newer kiln, or declares a record schema this reader cannot parse;
        for an empty path or one that holds no dataset (see `locate`).
      TypeError: for a path that is not a str or `os.PathLike` (None).
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
