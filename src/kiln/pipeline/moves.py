"""Records of a base version rewritten for files that moved to another key, without decoding.

A file renamed, moved to another folder or class folder, or listed by a
manifest under another path has a key the base (`incremental`) has no
record of, so the join by key finds nothing to reuse and, without this,
its image would be decoded, transformed and encoded again: renaming one
class folder of 100,000 images would cost a full build of that class.
Its bytes are unchanged, though, and a record's bytes are a function of the
file's bytes, its listing inputs and the processing: only the ``key`` and
class features tell where it was listed.

So a listed file whose key found no reusable record, and whose sha256 is
that of a base record whose key is no longer listed (an *orphan*: the base
index rows the join by key left over), is matched against those records: a
record matches when its listing inputs (`record_index.inputs_fingerprint`)
equal the file's with the key, and the class id, replaced by the base
record's, and with targets the annotations' class ids by the base's
(`relabel`): every other input (annotations, mask files by sha256, extras)
must be equal. The matching record is read from the base's shard, its
``key`` and class ids (``label``, and mapped through `relabel.Relabel`
when the class list changed too: ``labels``, ``classes``) are rewritten,
and it is serialized again: the bytes a build from scratch writes.

**Which record** when several orphans have the file's bytes (duplicate
files): the matching one whose key sorts first (`candidates`). They make
the same bytes anyway (same source bytes, same inputs but the key and class,
same processing): the rule only fixes which base shard is read.

Processed from their files instead are, besides what `relabel` excludes
(a semantic ``mask`` dataset whose class list changed):
- a file of a dataset with targets whose image class changed (the image's
  class is one of the classes its statistics count);
- a file whose bytes match a base record that is still listed under its own
  key (a copy, or two files swapped): only orphans are candidates, so the
  search stays as small as what was deleted or moved.

In the job (`job.construct`) the first image step hands a file on
(``deferred``, with its sha256) instead of decoding it when its sha256's
first 8 bytes are among the orphans' (`Digests`, a side input of one bytes
value, 8 bytes per orphan: `incremental.PackDigestsFn`);
`incremental.JoinMoved` joins those files with the orphans by sha256, and a
second image step rewrites the matching records (or, with none, processes
the file). From a gzip-compressed base, that step hands the files on once
more, grouped by the base shard that holds the matching record, and each
such shard is inflated once (`images.RewriteFromBaseShards`). When that
read fails (the shard changed since its check), the file is processed; the
other matching records of its bytes, if any, are not tried.
"""

from __future__ import annotations

import array
import bisect
from collections.abc import Iterable

import numpy as np

from kiln.pipeline.record_index import IndexRow


def digest_prefix(sha256: str) -> int:
    """A sha256 (hex) as the integer of its first 8 bytes: what `Digests` holds."""
    return int(sha256[:16], 16)


def pack(prefixes: array.array) -> bytes:
    """`digest_prefix` values (an ``array.array("Q")``) as what `Digests`
    wraps: sorted, each once, 8 bytes each in the machine's order (as
    `array.array("Q")` writes them; every Beam runner's workers are
    little-endian). Sorted without making a Python int of each."""
    return np.unique(np.frombuffer(prefixes, dtype=np.uint64)).tobytes()


class Digests:
    """The orphans' sha256 prefixes (`digest_prefix`), as `pack` gives them:
    8 bytes each, wrapped where they are (a view, not a copy).

    Membership may be a false positive (another sha256 with the same first
    8 bytes): such a file takes the detour through `incremental.JoinMoved`
    and is processed from its file there, as it would have been.
    """

    def __init__(self, packed: bytes = b""):
        self._sorted = memoryview(packed).cast("Q")

    def __len__(self) -> int:
        return len(self._sorted)

    @property
    def nbytes(self) -> int:
        """Bytes the prefixes take (8 each)."""
        return self._sorted.nbytes

    def __contains__(self, sha256: object) -> bool:
        if not isinstance(sha256, str) or not self._sorted:
            return False
        prefix = digest_prefix(sha256)
        i = bisect.bisect_left(self._sorted, prefix)
        return i < len(self._sorted) and self._sorted[i] == prefix


def candidates(rows: Iterable[IndexRow], sha256: str) -> list[IndexRow]:
    """The base records a file of bytes `sha256` may have moved from, in the
    order they are tried: the rows of that sha256, by key (then by split,
    shard and position: a key is unique within a version, so those only
    order rows a damaged index repeats)."""
    return sorted(
        (row for row in rows if row.sha256 == sha256),
        key=lambda row: (row.key, row.split, row.shard, row.position),
    )
