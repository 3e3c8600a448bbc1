"""Writes the TFDS-compatible metadata files into a staged version folder.

The launcher calls `write_tfds_metadata` just before `kiln.json`, which
stays the last file written. The file contents come from
`kiln.schemas.tfds_metadata`; datasets TFDS cannot read (gzip shards, raw
pixels of varying sizes) get none, and the build says so in the log.
`repair_tfds_metadata` rewrites those of a published version that no longer
match its kiln.json, when a build makes that version again.
"""

from __future__ import annotations

import logging

from kiln.pipeline import storage
from kiln.schemas import DatasetInfo
from kiln.schemas.tfds_metadata import TfdsUnsupported, missing_tfds_files, tfds_files

logger = logging.getLogger(__name__)


def write_tfds_metadata(directory: str, info: DatasetInfo) -> list[str]:
    """Writes ``dataset_info.json``, ``features.json`` and the labels file into `directory`.

    Returns:
      The names of the files written; empty when the dataset cannot be read
      by TFDS (logged with the reason, not an error: kiln's own reader reads
      every dataset).
    """
    try:
        files = tfds_files(info)
    except TfdsUnsupported as e:
        logger.info("no TFDS metadata for %s: %s", info.name, e)
        return []
    for name in sorted(files):
        storage.write_text(storage.join(directory, name), files[name])
    return sorted(files)


def repair_tfds_metadata(directory: str, info: DatasetInfo) -> list[str]:
    """Rewrites the TFDS metadata files of the published version in `directory`
    whose bytes differ from what its kiln.json (`info`) describes.

    kiln.json records no sha256 of these files, so the shards' repair
    (`kiln.pipeline.publish.damaged_files`) does not see them; `kiln verify`
    does, and fails on them, since TFDS would read other class names, splits
    or counts than kiln.json's. They are a pure function of kiln.json, so
    `kiln build --rehash` or ``--full`` making the same version writes them
    again, each atomically, and logs a warning naming them. A file missing
    beside the others (TFDS cannot read the version without it) is written
    too; a version without any (built before kiln wrote TFDS metadata) is
    left without, as `kiln verify` accepts it.

    Returns:
      The names of the files written.
    """
    try:
        files = tfds_files(info)
    except TfdsUnsupported:
        return []
    store = storage.store_for(directory)
    found = {name: store.read_bytes(storage.join(directory, name)) for name in sorted(files)}
    if missing_tfds_files(found, lambda name: found[name] is not None) is None:
        return []
    repaired = [name for name, data in found.items() if data != files[name].encode("utf-8")]
    for name in repaired:
        storage.write_text(storage.join(directory, name), files[name])
    if repaired:
        logger.warning(
            "repaired version %s: wrote %d TFDS metadata file(s) missing or differing from "
            "its kiln.json again: %s",
            info.version,
            len(repaired),
            ", ".join(repaired),
        )
    return repaired
