"""The up-to-date check: the version an inputs' stamp names, its racily clean files verified.

A build whose inputs' stamp (`versioning.stamp_of`: the config and every
listed file's key, size and modification time, and a local file's inode
and ctime) names a complete version runs no job (`launcher.build`). That
trusts the stamps, as git does (a local file swapped with another by
renames, or replaced by a copy with its time restored, has another inode
or ctime: the stamp differs, and the job reads it), with one blind spot
that git calls "racily clean": a file modified
within a tick of the file system's clock of the start of the build that
made the version may have been rewritten after that build read it, in
the same tick, so with the size and modification time listed. Such a file
(modified at or after that start less `incremental.RACY_SECONDS`, dated in
the future included) is not trusted: it is read and hashed now and
compared with the sha256 the version's record index keeps for its key, as
git compares a racily clean entry's content; so is such a mask file, with
the sha256 the record of its image keeps of it (`record_index.IndexRow.masks`).
A file the build dropped having read it has no record: its sha256 is the
one the job kept for it beside the version (`write_dropped_sha256s`, in
the version's ``.file-stamps`` folder: not errors.jsonl, whose bytes are
the version's). If all are equal the version is up to date; if one
differs, or cannot be verified so (a file dropped unread, or by a kiln
that kept no such sha256; a mask file of a record that keeps no mask
sha256s, written by a kiln before it kept them; a file that cannot be
read), the build runs, and its job reads such files again
(`incremental.JoinBase`).

A file the check reads is also compared with what the listing said of it
(size and modification time, as the open file gives them: `storage.input_stamp`);
one that changed since it was listed is not verified, whatever its bytes:
the bytes read are not those of the listed stamp.

The stamp also cannot tell a file that changed between the listing and the
job's read of it (a mask file that appeared, an image rewritten and
restored, time and all): the version holds bytes the listing never
stamped. The job compares each file it reads with its listing and keeps
those that disagree beside the version (`stamp_disagreements`,
`publish.STAMP_DISAGREEMENTS_FILE`); a version that has one (or whose
record of them cannot be read) is not up to date: the build runs the job,
which reads those files again (`incremental.JoinBase`) and reuses the
records whose bytes did not change. That is read first, one small file
that exists only after such a race.

When no listed file is that recent (`newest_mtime`, which the listing
knows without reading a file) nothing is read. A build that verified its
racily clean files so keeps the time it started verifying as the
version's build start (`publish.DatasetRoot.mark_verified`), as git
refreshes its index: the files it read are then older than that start,
and the next check reads them again only if they are still that recent. A version whose start is
not kept (`publish.LISTED_FROM_FILE`: built by a kiln before it kept one,
or its ``.file-stamps`` folder was deleted) is trusted as it was before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Protocol

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from kiln.pipeline import (
    incremental,
    publish,
    record_index,
    stamp_disagreements,
    storage,
    target_rows,
)
from kiln.pipeline.error_report import DroppedFile
from kiln.pipeline.listing import SourceFile
from kiln.schemas import INDEX_FILENAME, DatasetInfo

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20


class StampedListing(Protocol):
    """What the check needs of a listing (`listing.Listing`, `listing_job.ListedInJob`)."""

    @property
    def newest_mtime(self) -> float: ...

    def files_modified_since(self, since: float) -> Iterator[SourceFile]: ...


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the version an input stamp names is up to date.

    Attributes:
      info: The version's kiln.json when it is up to date, else None.
      verified: Files read and found equal to the version's records (the
        racily clean ones; 0 when none was that recent).
      problem: Why a version the stamp names is not up to date ("" when
        it is, or when the stamp names none).
    """

    info: DatasetInfo | None
    verified: int = 0
    problem: str = ""
    verified_from: float = 0.0  # when the reading of the `verified` files started


def check(
    dataset: publish.DatasetRoot, stamp: str, listing: StampedListing, *, refresh: bool = False
) -> Verdict:
    """The complete version `stamp` was built into, if its files are as
    that build read them (see the module docstring); logs how many files
    were verified, or why the version is not up to date.

    `refresh`: when racily clean files were verified, keep the time their
    reading started as the version's build start, so the next check does
    not read them again (a build holding the dataset's lock; never a dry
    run, which writes nothing)."""
    existing = dataset.stamped_version(stamp)
    info = dataset.read_info(existing) if existing else None
    if info is None:
        return Verdict(None)
    verdict = _verified(dataset, info, listing)
    if refresh and verdict.verified:
        _mark_verified(dataset, info.version, verdict.verified_from)
    if verdict.problem:
        logger.info("not up to date with version %s: %s", info.version, verdict.problem)
    elif verdict.verified:
        logger.info(
            "read the %d file%s modified within %g s of the start of version %s's build: "
            "their bytes are its records'",
            verdict.verified,
            "" if verdict.verified == 1 else "s",
            incremental.RACY_SECONDS,
            info.version,
        )
    return verdict


def _verified(dataset: publish.DatasetRoot, info: DatasetInfo, listing: StampedListing) -> Verdict:
    problem = _disagreement(dataset, info.version)
    if problem:
        return Verdict(None, problem=problem)
    try:
        started = dataset.build_started(info.version)
    except Exception as e:  # damaged, unreadable: its racily clean files are unknown
        return Verdict(None, problem=f"its build's start time cannot be read ({_short(e)})")
    if started is None:  # an older kiln's version: trusted, as it was then
        return Verdict(info)
    since = started - incremental.RACY_SECONDS
    if listing.newest_mtime < since:
        return Verdict(info)
    # Before any file is read: a file last modified before this time less
    # RACY_SECONDS is read after its last write (`mark_verified`).
    verified_from = time.time()
    try:
        racy = {file.key: file for file in listing.files_modified_since(since)}
    except Exception as e:  # a listing job's file vanished...: not verified
        return Verdict(None, problem=f"the listing cannot be read ({_short(e)})")
    read: list[str] = []
    problem = _problem(dataset, info, since, racy.values(), read)
    if problem:
        return Verdict(None, problem=problem)
    return Verdict(info, verified=len(read), verified_from=verified_from)


def _disagreement(dataset: publish.DatasetRoot, version: str) -> str:
    """Why `version` is not as its listing stamped it: a file its job read
    was not as listed (`stamp_disagreements`), or the record of those
    cannot be read; "" when there was none."""
    path = dataset.stamp_disagreements(version)
    try:
        first = next(stamp_disagreements.read(path), None)
    except Exception as e:  # unreadable, damaged: not known to be as listed
        return f"the files its job found changed cannot be read ({_short(e)})"
    return "" if first is None else f"its job read a file not as listed: {first.describe()}"


def _mark_verified(dataset: publish.DatasetRoot, version: str, verified_from: float) -> None:
    """Keeps `verified_from` as `version`'s build start; a failure to write
    it costs the next check the same reads, not the build."""
    try:
        dataset.mark_verified(version, verified_from)
    except Exception as e:  # a read-only or flaky store: the next check reads them again
        logger.warning(
            "%s: the time its files were verified cannot be kept (%s)", version, _short(e)
        )


def _problem(
    dataset: publish.DatasetRoot,
    info: DatasetInfo,
    since: float,
    racy: Iterable[SourceFile],
    read: list[str],
) -> str:
    """Why the racily clean files (and mask files) do not verify against
    `info`'s record index, or "" when every one does; appends each file it
    reads to `read`."""
    racy = list(racy)
    if not racy:
        return ""
    if info.index_sha256 is None:
        return "it keeps no record index to verify recently modified files with"
    index_uri = storage.join(dataset.version_dir(info.version), INDEX_FILENAME)
    try:
        recorded = record_index.sha256s_of(index_uri, [file.key for file in racy])
    except Exception as e:  # vanished, damaged: nothing to verify with
        return f"its record index cannot be read ({_short(e)})"
    if recorded.index_sha256 != info.index_sha256:
        return f"{INDEX_FILENAME}: sha256 differs from its kiln.json"
    unrecorded = [file.key for file in racy if file.key not in recorded.by_key]
    dropped: dict[str, str] = {}
    if unrecorded:
        try:
            dropped = read_dropped_sha256s(
                dataset.dropped_sha256s(info.version),
                unrecorded,
            )
        except Exception as e:  # missing (an older kiln's), damaged: not verified
            logger.debug("dropped files' sha256 not read: %s", e)
    for file in racy:
        expected = recorded.by_key.get(file.key) or dropped.get(file.key)
        if expected is None:
            return (
                f"{file.key}: modified as that version's build started, and it has no "
                f"record (nor the sha256 of a file it dropped)"
            )
        if file.mtime >= since:
            read.append(file.uri)
            try:
                sha256, seen = _file_sha256(file.uri)
            except Exception as e:  # vanished, unreadable: the build says what
                return f"{file.key}: cannot be read ({_short(e)})"
            changed = stamp_disagreements.compare(file.key, file.uri, (file.size, file.mtime), seen)
            if changed is not None:  # the bytes read are not those listed
                return changed.describe()
            if sha256 != expected:
                return f"{file.key}: its bytes differ from its record's, its size and time the same"
        problem = _masks_problem(file, since, recorded.masks_by_key.get(file.key), read)
        if problem:
            return problem
    return ""


def _masks_problem(
    file: SourceFile, since: float, expected: Sequence[str | None] | None, read: list[str]
) -> str:
    """Why the mask files of `file` modified at or after `since` do not
    verify against the sha256s its record keeps of them (`expected`, in
    `target_rows.mask_uris` order), or "" when every one does."""
    if file.mask_stamp is None or file.targets is None:
        return ""
    stamps = json.loads(file.mask_stamp)  # [[size, mtime(, inode_ctime)], ...], in order
    uris = [uri for _, uri in target_rows.mask_uris(json.loads(file.targets))]
    for index, uri in enumerate(uris):
        if index < len(stamps) and float(stamps[index][1]) < since:
            continue
        if expected is None or len(expected) != len(uris) or expected[index] is None:
            return (
                f"{file.key}: a mask file it names was modified as that version's build "
                f"started, and its record keeps no sha256 of it"
            )
        read.append(uri)
        try:
            sha256, seen = _file_sha256(uri)
        except Exception as e:  # vanished, unreadable: the build says what
            return f"{file.key}: its mask file {uri} cannot be read ({_short(e)})"
        listed = (int(stamps[index][0]), float(stamps[index][1])) if index < len(stamps) else None
        changed = stamp_disagreements.compare(file.key, uri, listed, seen, mask=True)
        if changed is not None:  # the bytes read are not those listed
            return changed.describe()
        if sha256 != expected[index]:
            return (
                f"{file.key}: the bytes of its mask file {uri} differ from its record's, "
                f"its size and time the same"
            )
    return ""


def write_dropped_sha256s(path: str, rows: Iterable[DroppedFile]) -> None:
    """Writes, to `path`, the key and sha256 of each of `rows` whose bytes
    the job read (`DroppedFile.sha256`), with the stage, reason and message
    it was dropped with, one JSON object a line, sorted by key (an empty
    file for none): what `read_dropped_sha256s` reads, and what the next
    build's `incremental.JoinBase` drops a file again by without reading
    it (`incremental.dropped_again`)."""
    found = sorted(
        {(row.key, row.sha256, row.stage, row.reason, row.message) for row in rows if row.sha256}
    )
    data = "".join(
        json.dumps(
            {"key": key, "sha256": sha256, "stage": stage, "reason": reason, "message": message},
            sort_keys=True,
        )
        + "\n"
        for key, sha256, stage, reason, message in found
    )
    with storage.create(path) as f:
        f.write(data.encode("ascii"))


def read_dropped_sha256s(path: str, keys: Collection[str]) -> dict[str, str]:
    """The sha256 `write_dropped_sha256s` kept in `path` for those of
    `keys` it holds, read a line at a time.

    Raises:
      ValueError: a line is not what it writes.
      OSError, BeamIOError: the file cannot be read.
    """
    wanted = set(keys)
    found: dict[str, str] = {}
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        for number, line in enumerate(f, start=1):
            try:
                row = json.loads(line)
                key, sha256 = row["key"], row["sha256"]
            except (ValueError, TypeError, KeyError):
                key = sha256 = None
            if not (isinstance(key, str) and _is_sha256(sha256)):
                raise ValueError(f"{path}: line {number} is not a key and its sha256")
            if key in wanted:
                found[key] = sha256
    return found


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef")


def _file_sha256(uri: str) -> tuple[str, stamp_disagreements.Seen]:
    """The sha256 (hex) of a listed file's bytes, read a chunk at a time, and
    its size and modification time as the read found them
    (`storage.input_stamp`), to compare with the listing's."""
    digest = hashlib.sha256()
    size = 0
    with storage.open_input(uri) as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), storage.input_stamp(f, uri, size)


def _short(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__
