"""Files that changed between the listing and the job's read: kept, so no build trusts their stamps.

The launcher lists the inputs (each image's size and modification time;
with targets, each mask file's, ``[-1, 0.0]`` for one it did not find:
`listing.SourceFile`) before the job reads them, and what it listed is what
the next build trusts: the inputs' stamp names this build's version
(`up_to_date`), and each file's stamp vouches for the sha256 its record
keeps (`incremental.JoinBase`). A file that changes between the listing
and the read (a mask file that appears after the listing, an image
rewritten while the build runs and restored after it, time and all)
leaves the version holding bytes that were never there at the listed
stamp, and the next listing shows nothing.

So the job compares what it sees of each input it reads, as it reads it
(`storage.input_stamp`: a local file's size and modification time from the
open file, after the read; an object's size as read, not its update time,
which would cost a request per object), with what the listing said
(`compare`), and keeps every disagreement beside the version, in its
``.file-stamps`` folder (`publish.STAMP_DISAGREEMENTS_FILE`, written only
when there is one: not errors.jsonl or anything else whose bytes are the
version's, so a build without such a race writes the same bytes as before).
The next build's up-to-date check does not keep a version that has one (it
runs the job), and that job does not trust those files' listed stamps: it
reads them (`incremental.JoinBase`). The up-to-date check compares the
files it reads in the same way (`up_to_date`). Files the job does not read
(their stamps trusted from a base) are not compared: nothing is opened or
stat'ed for that.

Not covered: on an object store, an object rewritten with the same size
between the listing and the read (its update time is not known without a
request); and a file changed and restored (time and all) entirely between
two reads (nothing can see that but its bytes: ``kiln build --rehash``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from kiln.pipeline import storage

logger = logging.getLogger(__name__)

Stamp = tuple[int, float]  # (size, modification time) as listed
Seen = tuple[int, float | None]  # (size, modification time or None: not known) as read


class StampDisagreement(NamedTuple):
    """An input the job read that was not as the listing stamped it.

    Attributes:
      key: The listed file's key (for a mask file, its image's).
      uri: The file read (the image, or the mask file).
      mask: Whether it is a mask file the image's targets name.
      listed: ``(size, mtime)`` as listed (size -1: not found).
      read: ``(size, mtime)`` as the job found it (mtime None: not known,
        an object store), or None: not found.
    """

    key: str
    uri: str
    mask: bool
    listed: Stamp
    read: Seen | None

    def describe(self) -> str:
        """What differs, for a warning or a reason (naming the file)."""
        what = "mask file " if self.mask else ""
        listed = "not found" if self.listed[0] < 0 else _stamp_text(self.listed)
        read = "not found" if self.read is None else _stamp_text(self.read)
        return (
            f"{self.key}: {what}{self.uri} changed between the listing and its read "
            f"(listed: {listed}; read: {read})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "uri": self.uri,
            "mask": self.mask,
            "listed": list(self.listed),
            "read": None if self.read is None else list(self.read),
        }

    @classmethod
    def from_json(cls, data: Any) -> StampDisagreement:
        """Raises ValueError unless `data` is what `to_json` gives."""
        try:
            key, uri, mask = data["key"], data["uri"], data["mask"]
            listed, read = data["listed"], data["read"]
            size, mtime = listed
            found = None if read is None else (int(read[0]), _optional_time(read[1]))
            if not (isinstance(key, str) and isinstance(uri, str) and isinstance(mask, bool)):
                raise TypeError
            return cls(key, uri, mask, (int(size), float(mtime)), found)
        except (TypeError, KeyError, ValueError, IndexError):
            raise ValueError("not a stamp disagreement") from None


def _optional_time(value: Any) -> float | None:
    return None if value is None else float(value)


def _stamp_text(stamp: Seen) -> str:
    size, mtime = stamp
    return f"{size} bytes" if mtime is None else f"{size} bytes, modified at {mtime!r}"


def listed_stamp(size: Any, mtime: Any) -> Stamp | None:
    """A listed ``(size, mtime)`` to compare with, or None when the listing
    gave none (an item built without them)."""
    if size is None or mtime is None:
        return None
    return int(size), float(mtime)


def compare(
    key: str, uri: str, listed: Stamp | None, read: Seen | None, *, mask: bool = False
) -> StampDisagreement | None:
    """The disagreement between what the listing stamped of a file and what
    its read found (`read` None: not found), or None when they agree.

    A file listed as not found (a mask file of size -1 in
    `listing.SourceFile.mask_stamp`) disagrees when it is found; one listed
    with a time (above 0) disagrees when it is not found, or is found with
    another size or another time (where the read knows one). A file listed
    without a time (0: a dangling link, a store that gives none) is compared
    by its size alone, and not being found is what its listing said.
    """
    if listed is None:
        return None
    size, mtime = listed
    if size < 0:
        agree = read is None
    elif read is None:
        agree = mtime <= 0
    else:
        agree = read[0] == size and (read[1] is None or mtime <= 0 or read[1] == mtime)
    return None if agree else StampDisagreement(key, uri, mask, listed, read)


def write(path: str, rows: Iterable[StampDisagreement]) -> int:
    """Writes `rows` to `path`, one JSON object a line, sorted and without
    repeats (a file read twice), when there is one (no file otherwise: a
    build without races writes nothing new); returns how many lines."""
    lines = sorted({json.dumps(row.to_json(), sort_keys=True) + "\n" for row in rows})
    if lines:
        with storage.create(path) as f:
            f.write("".join(lines).encode("ascii"))
    return len(lines)


def read(path: str) -> Iterator[StampDisagreement]:
    """The disagreements `write` kept in `path`, a line at a time; none when
    there is no such file (no race, or a kiln before it kept them).

    Raises:
      ValueError: a line is not what `write` writes.
      OSError, BeamIOError: the file is there and cannot be read.
    """
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    f = None
    try:  # an object store may say that it is missing at the first read only
        f = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        line = f.readline()
    except Exception as e:
        if f is not None:
            f.close()
        if storage.is_missing_input(e):
            return
        raise
    with f:
        number = 1
        while line:
            try:
                yield StampDisagreement.from_json(json.loads(line))
            except ValueError:
                raise ValueError(f"{path}: line {number} is not a stamp disagreement") from None
            line = f.readline()
            number += 1
