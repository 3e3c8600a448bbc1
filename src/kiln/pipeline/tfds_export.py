"""Writes the TFDS-compatible metadata files into a staged version folder.

The launcher calls `write_tfds_metadata` just before `kiln.json`, which
stays the last file written. The file contents come from
`kiln.schemas.tfds_metadata`; datasets TFDS cannot read (gzip shards, raw
pixels of varying sizes) get none, and the build says so in the log.
"""

from __future__ import annotations

import logging

from kiln.pipeline import storage
from kiln.schemas import DatasetInfo
from kiln.schemas.tfds_metadata import TfdsUnsupported, tfds_files

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
