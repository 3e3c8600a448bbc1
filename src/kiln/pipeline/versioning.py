"""Fingerprints: the dataset version and the cheap "up to date" stamp.

Two fingerprints, for two jobs:

- The **version** names a built dataset (``<output>/<name>/<version>/``). It is
  content-addressed: a hash of the resolved config's fingerprint, the
  processing fingerprint (`incremental.processing_fingerprint`: kiln's
  processing version, the record schema and OpenCV's version beside the
  processing config, so a kiln upgrade that changes what the kernels write
  gives another version, never other bytes under the same name),
  `kiln.FORMAT_VERSION` and, for every input, its key, label name, split from
  the source and the sha256 of its bytes (plus what the listing dropped, and
  the class list where neither the config nor the files' entries imply it: a
  COCO category no annotation uses, `launcher._class_names_hash`). The
  job hashes every file's bytes anyway, so the version costs nothing extra and
  identical inputs give the identical version (and identical `kiln.json`) on
  any machine, whatever the files' modification times. Versions name content
  and processing, not locations: keys are relative to the source's root (or
  the manifest's folder), and the config fingerprint leaves out the source's
  location and the output root (`config.BuildSpec.to_json`), so the same
  files moved to another folder or bucket are the same version. kiln.json
  records the location as ``provenance``, outside the fingerprint.
- The **stamp** decides whether a rebuild can be skipped without running the
  job. It hashes what the launcher learns from listing alone: keys, label
  names, splits, byte sizes and modification times and, for local files,
  their inode numbers and status-change times (``inode_ctime``, as git's
  index keeps them: `storage.inode_ctime`), the class list as the version
  takes it, plus the config and processing
  fingerprints and the format version (after a kiln upgrade that changes
  the processing, an unchanged source is built again). A build records
  ``.stamps/<stamp>`` -> version. Listing a million objects on gs:// is
  quick; reading them is not.
  A local file rewritten with its size and modification time restored
  (``cp -p``, ``tar x``, ``touch -r``), or two same-size files swapped by
  renames, change the stamp by their inode or ctime: the job runs, and
  reads those files (`incremental.JoinBase`). An object's stamp is its
  size and update time, which every write sets (a write within a tick of
  the clock of a build's start is read by the racy check: `up_to_date`).
  ``--rehash`` reads every file whatever its stamp. Touching a file, or a
  ``chmod``, forces a rebuild (which then finds the same version).

The per-input hashes are combined as a multiset (a sum of sha256 values
modulo 2**256), so the result does not depend on the order in which the
listing or Beam's workers see the files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import kiln
from kiln.schemas.location import VERSION_LENGTH
from kiln.schemas.metadata import canonical_json

_MODULUS = 1 << 256


def fingerprint(data: Any) -> str:
    """sha256 hex digest of `canonical_json(data)`."""
    return hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()


def entry_hash(entry: Any) -> int:
    """One multiset member: the sha256 of an entry's canonical JSON, as an int."""
    return int(fingerprint(entry), 16)


def combine_hashes(hashes: Iterable[int]) -> int:
    """The multiset hash of members: their sum modulo 2**256 (order-free)."""
    total = 0
    for value in hashes:
        total = (total + value) % _MODULUS
    return total


def file_entry(key: str, label: str | None, split: str | None, sha256: str | None) -> list:
    """What one listed input contributes to the version (label None: the
    dataset's targets have no image class; a dataset with targets appends
    the file's targets to this entry)."""
    return ["file", key, label, split, sha256]


def version_name(config_fingerprint: str, inputs_hash: int, *, processing: str) -> str:
    """The content-addressed version: a short hex id, stable across machines.

    Args:
      config_fingerprint: `config.BuildSpec.fingerprint`.
      inputs_hash: The multiset hash of every input's entry.
      processing: The processing fingerprint (`incremental.processing_fingerprint`).
    """
    return fingerprint(
        {
            "format_version": kiln.FORMAT_VERSION,
            "config": config_fingerprint,
            "processing": processing,
            "inputs": format(inputs_hash, "064x"),
        }
    )[:VERSION_LENGTH]


def stamp(config_fingerprint: str, listing_entries: Iterable[Any], *, processing: str) -> str:
    """The up-to-date stamp from listing data (see the module docstring);
    `processing` as for `version_name`."""
    inputs = combine_hashes(entry_hash(entry) for entry in listing_entries)
    return stamp_of(config_fingerprint, inputs, processing=processing)


def stamp_of(config_fingerprint: str, listing_hash: int, *, processing: str) -> str:
    """`stamp` from the multiset hash of the listing's entries, wherever they
    were combined (the launcher's listing, or the listing job's)."""
    return fingerprint(
        {
            "format_version": kiln.FORMAT_VERSION,
            "config": config_fingerprint,
            "processing": processing,
            "listing": format(listing_hash, "064x"),
        }
    )
