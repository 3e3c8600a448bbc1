"""Fingerprints: the dataset version and the cheap "up to date" stamp.

Two fingerprints, for two jobs:

- The **version** names a built dataset (``<output>/<name>/<version>/``). It is
  content-addressed: a hash of the resolved config's fingerprint,
  `kiln.FORMAT_VERSION` and, for every input, its key, label name, split from
  the source and the sha256 of its bytes (plus what the listing dropped). The
  job hashes every file's bytes anyway, so the version costs nothing extra and
  identical inputs give the identical version (and identical `kiln.json`) on
  any machine, whatever the files' modification times. (The source location
  is part of the resolved config, so the same files under another root are
  another version; the output root is not.)
- The **stamp** decides whether a rebuild can be skipped without running the
  job. It hashes what the launcher learns from listing alone: keys, label
  names, splits, byte sizes and modification times, plus the config
  fingerprint and format version. A build records ``.stamps/<stamp>`` ->
  version. Listing a million objects on gs:// is quick; reading them is not.
  Like make or rsync, a file rewritten with the same size and modification
  time is not noticed by the stamp; touching it forces a rebuild (which then
  finds the same version).

The per-input hashes are combined as a multiset (a sum of sha256 values
modulo 2**256), so the result does not depend on the order in which the
listing or Beam's workers see the files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import kiln
from kiln.schemas.metadata import canonical_json

VERSION_LENGTH = 12  # hex digits: 48 bits, no collision among a dataset's versions
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


def version_name(config_fingerprint: str, inputs_hash: int) -> str:
    """The content-addressed version: a short hex id, stable across machines."""
    return fingerprint(
        {
            "format_version": kiln.FORMAT_VERSION,
            "config": config_fingerprint,
            "inputs": format(inputs_hash, "064x"),
        }
    )[:VERSION_LENGTH]


def stamp(config_fingerprint: str, listing_entries: Iterable[Any]) -> str:
    """The up-to-date stamp from listing data (see the module docstring)."""
    inputs = combine_hashes(entry_hash(entry) for entry in listing_entries)
    return fingerprint(
        {
            "format_version": kiln.FORMAT_VERSION,
            "config": config_fingerprint,
            "listing": format(inputs, "064x"),
        }
    )
