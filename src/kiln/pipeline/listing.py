"""The listing of a build's inputs, kept in a temporary SQLite file rather than in memory.

A source (`sources`) can name millions of files. While it is read, every
row goes to a local SQLite database (`ListingWriter`); what stays in memory
is the class and split names and a few counters, whatever the number of
rows. SQLite does the work that needs every row at once: grouping a
manifest's rows by key (duplicate keys), and iterating in key order for the
job's listing (`Listing.write`) and the up-to-date stamp
(`Listing.stamp_entries`). Its own sorts spill to temporary files, so
memory stays bounded there too.

The database is SQLite's private temporary file (opened by the name ""):
SQLite removes its name from the folder as soon as it is created, so the
disk space comes back when the listing is closed (`Listing.close`; the
launcher closes it when the build ends, failed or not) and, whatever
happens, when the process ends: even a killed build leaves nothing behind.
The folder is ``SQLITE_TMPDIR``, else ``TMPDIR``, else /var/tmp; a listing
needs a few hundred bytes there per row (see BENCHMARKS.md).

Strings are stored as UTF-8 bytes with lone surrogates passed through (a
JSON manifest can hold ``"\\ud800"``; a local file name that is not UTF-8
arrives as surrogate escapes), so every Python string round-trips, and
SQLite's byte order on them is Python's code point order: rows come back in
exactly the order `sorted` would give.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule
from kiln.pipeline import splits, storage, target_rows, versioning
from kiln.pipeline.box_convention import BoxEvidence
from kiln.pipeline.error_report import DroppedFile, as_text, is_unicode, unicode_text

if TYPE_CHECKING:
    from apache_beam.io.filesystems import FileSystems
else:  # Beam on first use: validating a config needs none of it
    FileSystems = LazyModule("apache_beam.io.filesystems", "FileSystems")


@dataclasses.dataclass(frozen=True, order=True)
class SourceFile:
    """One input image, as listed.

    Attributes:
      key: Stable key, unique in the dataset (see `sources`).
      uri: Where to read it (local path or URI).
      label: Class id: index into the listing's `class_names`.
      split: Split named by the source (folder or manifest column), or None.
      size: Size in bytes when listed.
      mtime: Modification time when listed (seconds; an object's update
        time): for the up-to-date stamp, and for the job, which takes the
        sha256 of a file whose size and modification time are those the
        base version listed from the base's record index instead of reading
        it (`incremental.JoinBase`).
      targets: The row's targets as canonical JSON (`target_rows.canonical`),
        or None for a dataset without ``targets:``.
      mask_stamp: The sizes and modification times of the mask files the
        targets name, as JSON (``[[size, mtime], ...]``, one per
        `target_rows.mask_uris` of `targets`, in their order; a local
        mask file's with its `inode_ctime` as a third item; a mask that
        cannot be found is ``[-1, 0.0]``), None when there are none: for
        the up-to-date stamp (a mask edited in place changes no row), and
        in the job's listing line, where the next incremental build takes
        an unchanged mask file's sha256 from this build's record index
        instead of reading it (`incremental.JoinBase`).
      inode_ctime: A local file's status-change identity, its inode number
        and ctime (`storage.inode_ctime`); None for an object (its update
        time changes on every write). Part of the stamp as size and
        modification time are: a file swapped with another by renames, or
        replaced by a copy with its time restored (``cp -p``, ``tar x``,
        ``touch -r``), keeps those two but not this.

    A file of a dataset whose targets have no ``label`` has label -1.
    """

    key: str
    uri: str
    label: int
    split: str | None
    size: int
    mtime: float
    targets: str | None = None
    mask_stamp: str | None = None
    inode_ctime: str | None = None

    @property
    def newest_mask_mtime(self) -> float:
        """The latest modification time of the mask files its targets name
        (`mask_stamp`), 0.0 when they name none."""
        if self.mask_stamp is None:
            return 0.0
        return max((float(stamp[1]) for stamp in json.loads(self.mask_stamp)), default=0.0)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "key": self.key,
            "uri": self.uri,
            "label": self.label,
            "split": self.split,
            "size": self.size,
            "mtime": self.mtime,
        }
        if self.targets is not None:
            data["targets"] = self.targets
        if self.mask_stamp is not None:
            data["mask_stamp"] = json.loads(self.mask_stamp)
        if self.inode_ctime is not None:
            data["inode_ctime"] = self.inode_ctime
        return data


def job_uri(uri: str) -> str | bytes:
    """A listed file's URI as the job's elements carry it (`read_uri` turns it
    back). Beam's coders write a string as UTF-8, which a local path that is
    not UTF-8 (its undecodable bytes as surrogate escapes, e.g. below a
    folder named so) is not: such a path travels as bytes."""
    if uri.isascii() or is_unicode(uri):
        return uri
    return uri.encode("utf-8", "surrogatepass")


def read_uri(carried: str | bytes) -> str:
    """The URI `job_uri` carried, as the listing had it."""
    return carried if isinstance(carried, str) else carried.decode("utf-8", "surrogatepass")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A listed path before its checks: a manifest row or a file found in a folder.

    Attributes:
      key: The file's key; a manifest may list one key on several rows.
      position: Its place in the source (a manifest's line number), which
        orders the rows of one key.
      uri: Where to read it.
      label: Class name ("" when the dataset's targets have no ``label``).
      split: Split named by the source, or None.
      size, mtime: As a folder's walk found them; a manifest's rows are
        stat'ed after grouping (0 until then).
      targets: The row's targets as canonical JSON, or None.
      where: Where the source names it, for messages (a COCO file's
        ``<file>:images[<i>]``, a VOC file's path); None: a manifest's
        line, `position`.
    """

    key: str
    position: int
    uri: str
    label: str
    split: str | None
    size: int = 0
    mtime: float = 0.0
    targets: str | None = None
    where: str | None = None


# Files per line of the job's listing, and so per element of its image step:
# Beam's steps before it (read, parse, reshuffle) then run once per group
# instead of once per file. Small enough that a group is a fraction of a
# second of work, so Dataflow still balances groups across workers.
FILES_PER_LINE = 16

# Rows buffered in memory between inserts.
_BATCH = 10_000
# SQLite's page cache, KiB; its sorts spill to disk beyond about this much.
_CACHE_KIB = 16 * 1024

_SCHEMA = """
CREATE TABLE candidates (key BLOB, position INTEGER, uri BLOB, label BLOB, split BLOB,
                         size INTEGER, mtime REAL, targets BLOB, "where" BLOB);
CREATE TABLE files (position INTEGER PRIMARY KEY, key BLOB, uri BLOB, label INTEGER,
                    split BLOB, size INTEGER, mtime REAL, targets BLOB, mask_stamp BLOB,
                    inode_ctime BLOB);
CREATE TABLE dropped (key BLOB, stage BLOB, reason BLOB, uri BLOB, message BLOB, entry TEXT);
CREATE TABLE class_names (name BLOB PRIMARY KEY);
CREATE TABLE named_objects (folder BLOB, name BLOB, PRIMARY KEY (folder, name)) WITHOUT ROWID;
CREATE TABLE objects (uri BLOB PRIMARY KEY, size INTEGER, mtime REAL) WITHOUT ROWID;
"""
_INSERT = {
    "candidates": "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "files": "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "dropped": "INSERT INTO dropped VALUES (?, ?, ?, ?, ?, ?)",
    "class_names": "INSERT OR IGNORE INTO class_names VALUES (?)",
    "named_objects": "INSERT OR IGNORE INTO named_objects VALUES (?, ?)",
    "objects": "INSERT OR IGNORE INTO objects VALUES (?, ?, ?)",
}


def as_blob(text: str) -> bytes:
    """Text as a scratch database's BLOB: UTF-8 that keeps lone surrogates (a
    file name that is not valid UTF-8 keeps its bytes; SQLite's TEXT would not)."""
    return text.encode("utf-8", "surrogatepass")


def from_blob(data: bytes) -> str:
    """`as_blob`'s text back."""
    return data.decode("utf-8", "surrogatepass")


def _optional_blob(text: str | None) -> bytes | None:
    return None if text is None else as_blob(text)


def _optional_text(data: bytes | None) -> str | None:
    return None if data is None else from_blob(data)


# The reasons whose messages say where a file is (an absolute path, the
# system's error naming it): the location is not part of the version
# (`versioning`), so `dropped_entry` leaves their message out.
_WHEREABOUTS_REASONS = frozenset({"missing", "outside_source", "unreadable"})


def dropped_entry(dropped: DroppedFile, entry: Any) -> list:
    """What a row dropped while listing adds to the version and the stamp:
    the source's `entry` (what the row holds), the row's key (a COCO item's
    position, ``instances.json:annotations[3]``; a manifest's line) and its
    message (a VOC ``duplicate_key`` names its XML files), both as
    errors.jsonl shows them: the same version holds the same errors.jsonl
    (but for the location, in ``uri`` and in the messages of
    `_WHEREABOUTS_REASONS`, left out). The launcher's listing and the
    listing job (`listing_job`) both hash this."""
    message = "" if dropped.reason in _WHEREABOUTS_REASONS else dropped.message
    return _entry_as_text([entry, as_text(dropped.key), as_text(message)])


def _entry_as_text(entry: Any) -> Any:
    """A dropped row's entry with its strings as `unicode_text` shows them
    (JSON holds control characters; what it cannot hold is a lone surrogate)."""
    if isinstance(entry, str):
        return unicode_text(entry)
    if isinstance(entry, list):
        return [_entry_as_text(item) for item in entry]
    return entry


def folder_order(folder_count: tuple[str, int]) -> str:
    """Sort key that keeps the folders below a folder right after it."""
    return folder_count[0] + "/"


def _class_ids(text: str) -> tuple[int, ...]:
    """Class ids stored as ``"3,5"`` (`Listing.assign_splits_by_class_sets`)."""
    return tuple(int(c) for c in text.split(","))


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """`items` in lists of up to `_BATCH`."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, _BATCH)):
        yield chunk


def _connect() -> sqlite3.Connection:
    """A private temporary database (see the module docstring)."""
    # Autocommit mode: `ListingWriter` opens one transaction itself.
    connection = sqlite3.connect("", isolation_level=None)
    # A scratch file: no journal, no fsync; a crash loses nothing that matters.
    for pragma in (
        "journal_mode = OFF",
        "synchronous = OFF",
        "locking_mode = EXCLUSIVE",
        f"cache_size = -{_CACHE_KIB}",
        "temp_store = FILE",
    ):
        connection.execute(f"PRAGMA {pragma}")
    return connection


def scratch_database() -> sqlite3.Connection:
    """A private temporary SQLite database set up as the listing's own (see
    the module docstring), in autocommit mode: for a source that must spill
    rows of its own before it can list them (a COCO file's annotations)."""
    return _connect()


# `Listing`'s files in key order (the position is the key's rank), all or
# `_RECENT`: modified at or after a time (or naming mask files).
_FILES_QUERY = (
    "SELECT key, uri, label, split, size, mtime, targets, mask_stamp, inode_ctime FROM files "
    "{where} ORDER BY position"
)
_RECENT = "WHERE mtime >= ? OR mask_stamp IS NOT NULL"


class Listing:
    """Everything the launcher learned about the inputs before the job.

    The rows are on disk (see the module docstring); the methods iterate
    over them. Close the listing (or use it as a context manager) to give
    their disk space back.

    Attributes:
      class_names: The class names (`source.classes`, or those found, sorted); a
        label is an index into it.
      split_names: Sorted split names found in the source (only with
        ``splits.from_source``), else None.
      num_files: The images to process.
      num_dropped: Files and rows dropped while listing.
      box_evidence: What the listed files' boxes say about their convention
        (`box_convention.count_listed`), or None: the source lists no boxes.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        class_names: list[str],
        split_names: list[str] | None,
        num_files: int,
        num_dropped: int,
        box_evidence: BoxEvidence | None = None,
    ):
        self._connection = connection
        self.class_names = class_names
        self.split_names = split_names
        self.num_files = num_files
        self.num_dropped = num_dropped
        self.box_evidence = box_evidence

    @property
    def total(self) -> int:
        """Listed inputs: the files to process plus those already dropped."""
        return self.num_files + self.num_dropped

    @functools.cached_property
    def newest_mtime(self) -> float:
        """The latest modification time of the files to process and of the
        mask files their annotations name (0.0: none listed): what says
        whether a build started soon enough after a file changed that the
        file may change again unseen by its stamp (`incremental.RACY_SECONDS`)."""
        (newest,) = self._connection.execute("SELECT MAX(mtime) FROM files").fetchone()
        newest = float(newest or 0.0)
        for (stamps,) in self._query(
            "SELECT mask_stamp FROM files WHERE mask_stamp IS NOT NULL"
        ):  # [[size, mtime(, inode_ctime)], ...] per file
            newest = max([newest, *(float(stamp[1]) for stamp in json.loads(from_blob(stamps)))])
        return newest

    def files(self) -> Iterator[SourceFile]:
        """The images to process, sorted by key."""
        return self._files(_FILES_QUERY.format(where=""))

    def files_modified_since(self, since: float) -> Iterator[SourceFile]:
        """The images to process last modified at or after `since` (seconds
        since the epoch), or whose targets name a mask file that was, sorted
        by key: those a stamp kept from a build started just after `since`
        cannot vouch for (`incremental.RACY_SECONDS`)."""
        for file in self._files(_FILES_QUERY.format(where=_RECENT), (since,)):
            if file.mtime >= since or file.newest_mask_mtime >= since:
                yield file

    def _files(self, query: str, parameters: tuple[Any, ...] = ()) -> Iterator[SourceFile]:
        for row in self._connection.execute(query, parameters):
            key, uri, label, split, size, mtime, targets, mask_stamp, inode_ctime = row
            yield SourceFile(
                from_blob(key),
                from_blob(uri),
                label,
                _optional_text(split),
                size,
                mtime,
                _optional_text(targets),
                _optional_text(mask_stamp),
                _optional_text(inode_ctime),
            )

    def dropped(self) -> Iterator[DroppedFile]:
        """Files and rows dropped while listing, sorted (`DroppedFile`'s order)."""
        for row in self._query(
            "SELECT key, stage, reason, uri, message FROM dropped "
            "ORDER BY key, stage, reason, uri, message"
        ):
            yield DroppedFile(*map(from_blob, row))

    def dropped_entries(self) -> Iterator[list]:
        """What each dropped row contributes to the version and stamp
        (`dropped_entry`: the row's text for an unparsable row, its key and
        its message), sorted by their JSON text."""
        for (entry,) in self._query("SELECT entry FROM dropped ORDER BY entry"):
            yield json.loads(entry)

    def stamp_entries(self) -> Iterator[list]:
        """Listing data for the up-to-date stamp (`versioning.stamp`): a
        local file's status-change identity last (the entry of an object,
        which has none, is as a listing job's: `listing_job._file_outputs`)."""
        for f in self.files():
            label = self.class_names[f.label] if f.label >= 0 else None
            entry = ["file", f.key, label, f.split, f.size, f.mtime]
            if f.targets is not None:  # the names of COCO objects' annotations aside
                entry += [target_rows.unnamed_text(f.targets), f.mask_stamp]
            yield entry if f.inode_ctime is None else [*entry, f.inode_ctime]
        yield from self.dropped_entries()

    @functools.cached_property
    def class_names_implied(self) -> bool:
        """Whether the files to process name `class_names` exactly: every
        class in it is a file's label or a class its targets use, and it is
        sorted. Then the class list is in the stamp's and the version's file
        entries already; otherwise (a COCO category no annotation uses, a
        class only a dropped row names) it is not, and `class_names_hash`
        must say it."""
        wanted = set(self.class_names)
        seen: set[str] = set()
        ordered = self.class_names == sorted(wanted)
        for label, targets in self._query("SELECT label, targets FROM files"):
            if ordered and len(seen) == len(wanted):
                break  # every class seen: the rest need not be parsed
            if label >= 0:
                seen.add(self.class_names[label])
            if targets is not None:
                names = target_rows.class_names(json.loads(from_blob(targets)))
                seen.update(name for name in names if name in wanted)
        return ordered and seen == wanted

    def class_names_hash(self) -> int:
        """What the class list adds to the stamp and the version (a multiset
        member, `versioning.entry_hash`): 0 (nothing) when the files name it
        (`class_names_implied`), so that a dataset whose class list follows
        from its files keeps its version."""
        if self.class_names_implied:
            return 0
        return versioning.entry_hash(["class_names", self.class_names])

    def listing_hash(self) -> int:
        """The multiset hash of `stamp_entries`, for `versioning.stamp_of`."""
        return versioning.combine_hashes(map(versioning.entry_hash, self.stamp_entries()))

    def dropped_entries_hash(self) -> int:
        """The multiset hash of `dropped_entries`, for the version."""
        return versioning.combine_hashes(map(versioning.entry_hash, self.dropped_entries()))

    def assign_splits(
        self,
        draw: Callable[[str], float],
        assign_class: Callable[
            [Iterator[tuple[int, str | None]], dict[str, int], int], Iterator[tuple[int, str]]
        ],
        previous: Iterable[tuple[str, str]],
    ) -> None:
        """Sets every file's split, class by class (``splits.stratify``).

        Args:
          draw: A key's draw in [0, 1) (`splits.SplitPolicy.draw`).
          assign_class: Called once per class with its files' ``(position,
            previous split or None)`` in the order of their draws (then keys),
            the number of its files keeping each previous split, and its
            number of files; yields ``(position, split)``
            (`splits.stratify_class`, its fractions bound).
          previous: ``(key, split)`` of the files the previous version holds,
            for the splits to keep; keys not listed now are ignored.

        The rows stay on disk: the previous splits go into a table of the
        listing's database, and the files are read back sorted by SQLite.
        """
        connection = self._connection
        with self._assigning(draw, previous) as assigned:
            kept: dict[int, dict[str, int]] = {}
            for label, split, count in connection.execute(
                "SELECT f.label, p.split, COUNT(*) FROM files f JOIN previous p ON p.key = f.key "
                "GROUP BY f.label, p.split"
            ):
                kept.setdefault(label, {})[from_blob(split)] = count
            sizes = dict(connection.execute("SELECT label, COUNT(*) FROM files GROUP BY label"))
            rows = connection.execute(
                "SELECT f.label, f.position, p.split FROM files f LEFT JOIN previous p "
                "ON p.key = f.key ORDER BY f.label, draw(f.key), f.key"
            )
            for label, group in itertools.groupby(rows, key=lambda row: row[0]):
                files = ((position, _optional_text(split)) for _, position, split in group)
                assigned(assign_class(files, kept.get(label, {}), sizes[label]))

    def assign_splits_by_class_sets(
        self,
        draw: Callable[[str], float],
        classes_of: Callable[[str | None], tuple[int, ...]],
        fractions: Mapping[str, float],
        previous: Iterable[tuple[str, str]],
    ) -> None:
        """Sets every file's split by the set of classes it carries
        (``splits.stratify`` without an image label:
        `splits.stratify_class_sets`).

        Args:
          draw: A key's draw in [0, 1) (`splits.SplitPolicy.draw`).
          classes_of: A file's class ids from its listed targets (canonical
            JSON, or None), distinct; empty for a file that carries none.
          fractions: Split name -> fraction.
          previous: As for `assign_splits`.

        Three passes over the files, none of them held in memory: one counts
        the files per class (and those keeping their split) and stores each
        file's classes, one reads them back in stratum order, sorted by
        SQLite, as the splits are assigned.
        """
        connection = self._connection
        with self._assigning(draw, previous) as assigned:
            connection.execute(
                "CREATE TEMP TABLE strata (position INTEGER PRIMARY KEY, classes TEXT)"
            )
            sizes: dict[int, int] = {}
            kept: dict[int, dict[str, int]] = {}
            kept_files: dict[str, int] = {}
            total = 0
            rows = connection.execute(
                "SELECT f.position, f.targets, p.split FROM files f LEFT JOIN previous p "
                "ON p.key = f.key"
            )
            for chunk in _chunks(rows):
                strata = []
                for position, targets, split in chunk:
                    classes = classes_of(_optional_text(targets)) or (splits.NO_CLASS,)
                    for c in classes:
                        sizes[c] = sizes.get(c, 0) + 1
                    if split is not None:
                        name = from_blob(split)
                        kept_files[name] = kept_files.get(name, 0) + 1
                        for c in classes:
                            kept.setdefault(c, {})[name] = kept.get(c, {}).get(name, 0) + 1
                    strata.append((position, ",".join(map(str, classes))))
                    total += 1
                connection.executemany("INSERT INTO strata VALUES (?, ?)", strata)
            order = splits.class_set_order(sizes)
            connection.create_function(
                "stratum",
                1,
                lambda text: order[splits.key_class(_class_ids(text), order)],
                deterministic=True,
            )
            ordered = connection.execute(
                "SELECT s.position, s.classes, p.split FROM strata s "
                "JOIN files f ON f.position = s.position LEFT JOIN previous p ON p.key = f.key "
                "ORDER BY stratum(s.classes), draw(f.key), f.key"
            )
            files = (
                (position, _class_ids(classes), _optional_text(split))
                for position, classes, split in ordered
            )
            assigned(splits.stratify_class_sets(fractions, files, sizes, kept, kept_files, total))
            connection.execute("DROP TABLE strata")

    @contextlib.contextmanager
    def _assigning(
        self, draw: Callable[[str], float], previous: Iterable[tuple[str, str]]
    ) -> Iterator[Callable[[Iterable[tuple[int, str]]], None]]:
        """The scaffolding of an assignment of splits: the ``draw`` SQL
        function, the ``previous`` table of `previous`, and a function taking
        ``(position, split)`` pairs; on leaving, every file gets its split, in
        one transaction."""
        connection = self._connection
        connection.create_function("draw", 1, lambda key: draw(from_blob(key)), deterministic=True)
        connection.execute(
            "CREATE TEMP TABLE previous (key BLOB PRIMARY KEY, split BLOB) WITHOUT ROWID"
        )
        connection.execute("CREATE TEMP TABLE assigned (position INTEGER PRIMARY KEY, split BLOB)")
        connection.execute("BEGIN")
        for chunk in _chunks(previous):
            connection.executemany(
                "INSERT OR REPLACE INTO previous VALUES (?, ?)",
                [(as_blob(key), as_blob(split)) for key, split in chunk],
            )

        def assigned(pairs: Iterable[tuple[int, str]]) -> None:
            for chunk in _chunks(pairs):
                connection.executemany(
                    "INSERT INTO assigned VALUES (?, ?)",
                    [(position, as_blob(split)) for position, split in chunk],
                )

        yield assigned
        connection.execute(
            "UPDATE files SET split = "
            "(SELECT a.split FROM assigned a WHERE a.position = files.position)"
        )
        connection.execute("COMMIT")
        connection.execute("DROP TABLE previous")
        connection.execute("DROP TABLE assigned")

    def write(self, path: str) -> None:
        """Writes the listing as JSONL for the job: lines of up to
        `FILES_PER_LINE` files (``{"files": [...]}``), then one line per
        dropped row (``{"dropped": ...}``)."""
        files = self.files()
        with storage.create(path) as out:
            while chunk := list(itertools.islice(files, FILES_PER_LINE)):
                line = {"files": [f.to_json() for f in chunk]}
                out.write((json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
            for d in self.dropped():
                out.write(
                    (json.dumps({"dropped": d.to_json()}, sort_keys=True) + "\n").encode("utf-8")
                )

    @property
    def disk_bytes(self) -> int:
        """The size of the listing's temporary file (SQLite's sorts use more, briefly)."""
        (pages,) = self._connection.execute("PRAGMA page_count").fetchone()
        (page_size,) = self._connection.execute("PRAGMA page_size").fetchone()
        return pages * page_size

    def close(self) -> None:
        """Deletes the listing's rows: its temporary file goes."""
        self._connection.close()

    def __enter__(self) -> Listing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _query(self, sql: str) -> Iterator[tuple]:
        # A cursor of its own: iterations may interleave (files, then dropped).
        return self._connection.execute(sql)


class ListingWriter:
    """Collects a source's rows on disk and turns them into a `Listing`.

    A source adds every path it lists as a `Candidate` and every row it
    drops at once; then it reads the candidates back grouped by key
    (`candidates`), checks each, and adds the usable ones as files in that
    order (`add_file`). `finish` returns the `Listing`. Used as a context
    manager, the writer deletes everything if the block raises before
    `finish`.
    """

    def __init__(self):
        self._connection = _connect()
        self._connection.executescript(_SCHEMA)
        self._connection.execute("BEGIN")
        self._pending: dict[str, list[tuple]] = {
            "candidates": [],
            "files": [],
            "dropped": [],
            "class_names": [],
            "named_objects": [],
            "objects": [],
        }
        self._num_files = 0
        self._num_dropped = 0
        self._splits: set[str] = set()
        self._finished = False

    def __enter__(self) -> ListingWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self._finished:
            self._connection.close()

    def add_candidate(self, candidate: Candidate) -> None:
        self._add(
            "candidates",
            (
                as_blob(candidate.key),
                candidate.position,
                as_blob(candidate.uri),
                as_blob(candidate.label),
                _optional_blob(candidate.split),
                candidate.size,
                candidate.mtime,
                _optional_blob(candidate.targets),
                _optional_blob(candidate.where),
            ),
        )

    def add_class_names(self, names) -> None:
        """Records class names a row's targets use (labels, object classes):
        `candidate_labels` returns them with the candidates' labels."""
        for name in names:
            self._add("class_names", (as_blob(name),))

    def drop(self, dropped: DroppedFile, entry: Any) -> None:
        """Records a dropped row and its `Listing.dropped_entries` entry
        (`dropped_entry` of the source's `entry`).

        What a source drops may not be text (a file name that is not UTF-8,
        a manifest's lone surrogate) or may hold control characters: its
        strings are stored as `error_report.as_text` shows them (the entry's
        as `error_report.unicode_text` does), so that errors.jsonl and the
        version's hash can hold them.
        """
        self._num_dropped += 1
        self._add(
            "dropped",
            (
                *(
                    as_blob(as_text(text))
                    for text in (
                        dropped.key,
                        dropped.stage,
                        dropped.reason,
                        dropped.uri,
                        dropped.message,
                    )
                ),
                json.dumps(dropped_entry(dropped, entry), sort_keys=True),
            ),
        )

    def candidate_labels(self) -> list[str]:
        """Every label of a candidate and every name given to `add_class_names`, sorted."""
        self._flush("candidates")
        self._flush("class_names")
        rows = self._connection.execute(
            "SELECT label FROM candidates WHERE label != x'' UNION SELECT name FROM class_names"
        )
        return sorted(from_blob(label) for (label,) in rows)

    def candidates(self) -> Iterator[list[Candidate]]:
        """The candidates grouped by key, in key order; a group in position order."""
        self._flush("candidates")
        rows = self._connection.execute(
            'SELECT key, position, uri, label, split, size, mtime, targets, "where" '
            "FROM candidates ORDER BY key, position"
        )
        for _, group in itertools.groupby(rows, key=lambda row: row[0]):
            yield [
                Candidate(
                    from_blob(key),
                    position,
                    from_blob(uri),
                    from_blob(label),
                    _optional_text(split),
                    size,
                    mtime,
                    _optional_text(targets),
                    _optional_text(where),
                )
                for key, position, uri, label, split, size, mtime, targets, where in group
            ]

    def add_named_object(self, uri: str) -> None:
        """Records an object store URI that a row names (its image, a mask),
        under its folder (name prefix, without its '/'): `named_objects`."""
        folder, name = uri.rsplit("/", 1)
        self._add("named_objects", (as_blob(folder), as_blob(name)))

    def named_object_folders(self) -> list[tuple[str, int]]:
        """The recorded folders, each with the number of distinct objects
        recorded directly in it, sorted so that the folders below a folder
        come right after it (by the name followed by '/': ``a-b`` sorts
        before ``a/``, which sorts before ``a/c/``).

        What stays in memory is this list: one string per folder, not per row.
        """
        self._flush("named_objects")
        counted = self._connection.execute(
            "SELECT folder, COUNT(*) FROM named_objects GROUP BY folder"
        )
        return sorted(((from_blob(data), count) for data, count in counted), key=folder_order)

    def named_objects_in(self, folder: str) -> list[str]:
        """The URIs recorded directly in `folder` (see `add_named_object`), sorted."""
        self._flush("named_objects")
        return [
            f"{folder}/{from_blob(name)}"
            for (name,) in self._connection.execute(
                "SELECT name FROM named_objects WHERE folder = ? ORDER BY name", (as_blob(folder),)
            )
        ]

    def add_object(self, uri: str, size: int, mtime: float) -> None:
        """Records an object a listing or a metadata request found, for `object_status`."""
        self._add("objects", (as_blob(uri), size, mtime))

    def object_status(self, uri: str) -> tuple[int, float] | None:
        """The size and modification time of a listed object, or None if no
        listing found it (one lookup in the listing's database)."""
        self._flush("objects")
        found = self._connection.execute(
            "SELECT size, mtime FROM objects WHERE uri = ?", (as_blob(uri),)
        ).fetchone()
        return None if found is None else (found[0], found[1])

    def add_file(self, file: SourceFile) -> None:
        """Adds a file to process; files must come in key order."""
        if file.split is not None:
            self._splits.add(file.split)
        self._add(
            "files",
            (
                self._num_files,
                as_blob(file.key),
                as_blob(file.uri),
                file.label,
                _optional_blob(file.split),
                file.size,
                file.mtime,
                _optional_blob(file.targets),
                _optional_blob(file.mask_stamp),
                _optional_blob(file.inode_ctime),
            ),
        )
        self._num_files += 1

    def finish(
        self,
        class_names: list[str],
        splits_from_source: bool,
        box_evidence: BoxEvidence | None = None,
    ) -> Listing:
        """The listing; the writer is done with.

        Args:
          splits_from_source: The files' splits come from the source, so the
            listing names them (`Listing.split_names`).
          box_evidence: `Listing.box_evidence`.
        """
        for table in self._pending:
            self._flush(table)
        self._connection.execute("DELETE FROM candidates")
        self._connection.execute("DELETE FROM class_names")
        self._connection.execute("DELETE FROM named_objects")
        self._connection.execute("DELETE FROM objects")
        self._connection.execute("COMMIT")
        self._finished = True
        return Listing(
            self._connection,
            class_names,
            sorted(self._splits) if splits_from_source else None,
            self._num_files,
            self._num_dropped,
            box_evidence,
        )

    def _add(self, table: str, row: tuple) -> None:
        pending = self._pending[table]
        pending.append(row)
        if len(pending) >= _BATCH:
            self._flush(table)

    def _flush(self, table: str) -> None:
        pending = self._pending[table]
        if pending:
            self._connection.executemany(_INSERT[table], pending)
            pending.clear()
