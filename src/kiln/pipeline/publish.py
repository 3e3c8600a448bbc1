"""Atomic, versioned publishing of a built dataset, locally and on object stores.

A dataset root ``<output>/<name>/`` holds::

    <version>/              a complete dataset: shards, errors.jsonl, duplicates.jsonl,
                            index.jsonl, dropped_objects.jsonl (with boxes), kiln.json
    LATEST                  the name of the version readers should use
    .staging-<stamp>-<rnd>/ a build in progress (never read)
    .stamps/<stamp>         the version an input listing was built into
    .file-stamps/<version>/ the listing the version was last built from (each file's
                            key and stamp: size, modification time and, locally,
                            inode and ctime) and when that build
                            started (``.build-started``; or, later, when a build
                            verified its recent files: `up_to_date`) and the sha256
                            of the files it dropped, for the next build to trust
                            unchanged files' stamps (`incremental.JoinBase`) and to
                            verify the inputs' stamp (`up_to_date`)
    .listings/<rnd>/        a listing job's files, while its build runs (``source.listing: job``)
    .published/<version>    when LATEST last named the version (a sequence
                            number), so `DatasetRoot.prune` keeps the newest

A build writes everything into its staging folder inside a
`PublishTransaction`; `commit` writes `kiln.json` last, moves the folder to
``<version>/`` and replaces LATEST, last of all. Locally every file of the
version and its folder are fsynced before the move, the dataset folder after
it and after LATEST's replacement, so a power loss cannot leave LATEST naming
files that never reached the disk (object stores: a write that returned is
durable). A reader following LATEST
therefore never sees a half-written version, and a build killed at any moment
leaves the previous LATEST intact. How the folder moves depends on the store
(`storage`): one atomic rename locally; file by file with `kiln.json` last on
an object store, where a version folder without `kiln.json` is incomplete.

What an interrupted build or prune leaves behind (a staging folder, a version
folder without `kiln.json`: half copied on an object store, or half pruned,
with the records that name it) is deleted by the next build, which holds the
dataset's lock (`DatasetRoot.clean_leftovers`). A build stopped by Ctrl-C or
SIGTERM while it copies its version deletes the partial copy itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import secrets
import types
from collections.abc import Callable, Mapping, Sequence

from apache_beam.io.filesystems import FileSystems

from kiln.pipeline import interrupts, storage
from kiln.pipeline.tfds_export import repair_tfds_metadata, write_tfds_metadata
from kiln.schemas import (
    DROPPED_OBJECTS_FILENAME,
    DUPLICATES_FILENAME,
    ERRORS_FILENAME,
    INDEX_FILENAME,
    LATEST_FILENAME,
    METADATA_FILENAME,
    STAGING_PREFIX,
    DatasetInfo,
    MetadataError,
)
from kiln.schemas.location import decode_text, is_version_name

logger = logging.getLogger(__name__)

STAMPS_FOLDER = ".stamps"
FILE_STAMPS_FOLDER = ".file-stamps"
# In a version's file stamps: when the build that listed them started.
LISTED_FROM_FILE = ".build-started"
# In a version's file stamps: the key and sha256 of each file its build
# dropped having read it (`up_to_date.write_dropped_sha256s`).
DROPPED_SHA256S_FILE = ".dropped-sha256.jsonl"
# In a version's file stamps: the files its job read that were not as listed
# (`stamp_disagreements`); there only when there were such files.
STAMP_DISAGREEMENTS_FILE = ".stamp-disagreements.jsonl"
PUBLISHED_FOLDER = ".published"
# In PUBLISHED_FOLDER (hidden: not a publication record): the version kiln
# last wrote into LATEST, written right after it (`DatasetRoot.name_latest`).
NAMED_FILE = ".named"
WORK_FOLDER = ".work"  # inside staging: listing, temp shards, job report
LISTINGS_FOLDER = ".listings"  # a listing job's files (`listing_job`), until its build ends


@dataclasses.dataclass(frozen=True)
class DatasetRoot:
    """``<output>/<name>``: a dataset's versions, LATEST, stamps and staging folders.

    A build makes one and reads a version's kiln.json through it several
    times (is it up to date, the base to reuse, is the version already
    published): a damaged kiln.json is warned about once per instance
    (`read_info`), not once per read.
    """

    path: str
    # The versions whose kiln.json `read_info` found damaged and warned about.
    _damaged: set[str] = dataclasses.field(
        default_factory=set, init=False, repr=False, compare=False
    )

    @property
    def store(self) -> storage.Store:
        return storage.store_for(self.path)

    def version_dir(self, version: str) -> str:
        return storage.join(self.path, version)

    def is_complete(self, version: str) -> bool:
        """Whether a version folder holds a complete dataset (its kiln.json)."""
        return self.store.exists(storage.join(self.version_dir(version), METADATA_FILENAME))

    def latest(self) -> str | None:
        """The version LATEST names, or None. A damaged LATEST (bytes that
        are not UTF-8: shown escaped) names a version that is not there, as
        one naming a deleted version does."""
        text = self._read_small_file(storage.join(self.path, LATEST_FILENAME))
        return text.strip() or None if text else None

    def latest_names_none(self) -> str | None:
        """Why LATEST names no version while versions were published
        (``"<root>/LATEST is empty"`` or ``"... is missing"``), or None: it
        names one (there or not), or no version was ever published (a first
        build, or one killed before LATEST named its version)."""
        path = storage.join(self.path, LATEST_FILENAME)
        text = self._read_small_file(path)
        if text is not None and text.strip():
            return None
        if not self.published_versions():
            return None
        return f"{path} is {'missing' if text is None else 'empty'}"

    def published_versions(self) -> list[str]:
        """The complete versions LATEST has named (their publication
        records, `record_published`), sorted."""
        marked = sorted(self._published_marks())
        return sorted(self.complete_versions(marked)) if marked else []

    def _read_small_file(self, path: str) -> str | None:
        """The text of one of the root's small files (LATEST, a stamp, a
        publication record), or None if it does not exist. Bytes that are
        not UTF-8 (a damaged file, a bad edit by hand) come back escaped
        (``\\xff``): such a file names no version, like any other bogus text,
        rather than stopping the build."""
        data = self.store.read_bytes(path)
        return None if data is None else data.decode("utf-8", errors="backslashreplace")

    def read_info(self, version: str) -> DatasetInfo | None:
        """A version's `kiln.json`, or None if it is missing or does not check
        out (edited after it was written, damaged): such a version is rebuilt
        and replaced, never reused. A damaged one is warned about the first
        time it is read (`found_damaged`)."""
        path = storage.join(self.version_dir(version), METADATA_FILENAME)
        data = self.store.read_bytes(path)
        if data is None:
            return None
        try:
            return DatasetInfo.loads(decode_text(data, path), source=path)
        except MetadataError as e:  # not UTF-8, not JSON, malformed, edited
            if version not in self._damaged:
                self._damaged.add(version)
                logger.warning(
                    "%s; that version is not used (a build of its inputs rebuilds it)", e
                )
            return None

    def found_damaged(self, version: str) -> bool:
        """Whether `read_info` found `version`'s kiln.json damaged (and warned about it)."""
        return version in self._damaged

    def stamped_version(self, stamp: str) -> str | None:
        """The version this input stamp was built into, or None (it may have
        been pruned or damaged since: check it with `read_info`)."""
        text = self._read_small_file(storage.join(self.path, STAMPS_FOLDER, stamp))
        return text.strip() or None if text else None

    def file_stamps_dir(self, version: str) -> str:
        """Where the listing `version` was last built from is kept (`record_file_stamps`)."""
        return storage.join(self.path, FILE_STAMPS_FOLDER, version)

    def file_stamps(self, version: str) -> list[str]:
        """The files of the listing `version` was last built from (lines of
        the job's listing: each file's key and stamp),
        sorted; empty when none are kept (a version built before kiln kept
        them, or they were deleted)."""
        folder = self.file_stamps_dir(version)
        return [
            storage.join(folder, name)
            for name in self.store.children(folder)
            if not name.startswith(".")
        ]

    def file_stamps_listed_from(self, version: str) -> float | None:
        """When the build that listed `version`'s file stamps started
        (seconds since the epoch; `record_file_stamps`), or None."""
        try:
            return self.build_started(version)
        except ValueError:  # damaged: its stamps are not trusted
            return None

    def build_started(self, version: str) -> float | None:
        """When the build that last built `version` started, as kept with
        its file stamps (`record_file_stamps`); None when none is kept (a
        version built before kiln kept it, or its folder was deleted).

        Raises:
          ValueError: the file is there but holds no time (damaged).
        """
        path = storage.join(self.file_stamps_dir(version), LISTED_FROM_FILE)
        text = self.store.read_text(path)
        if text is None:
            return None
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"{path}: not a time: {text.strip()[:40]!r}") from None

    def record_file_stamps(
        self,
        version: str,
        listing_files: Sequence[str],
        listed_from: float,
        dropped_sha256s: str | None = None,
        stamp_disagreements: str | None = None,
    ) -> None:
        """Keeps `listing_files` (the job's listing, moved: a build's own
        files, in its staging or listing folder) as the listing `version`
        was built from, replacing what was kept for it before, and
        `listed_from`, when that build started (`incremental.RACY_SECONDS`);
        and the job's `dropped_sha256s` file (`DROPPED_SHA256S_FILE`) and
        `stamp_disagreements` file (`STAMP_DISAGREEMENTS_FILE`), moved too,
        where there is one."""
        folder = self.file_stamps_dir(version)
        self.store.delete_tree(folder)
        # When the build started before the listing: a listing kept without
        # it is trusted by its stamps alone (`build_started`), and a build
        # stopped in between (SIGTERM) left the listing of a version that
        # was already complete so. Alone, it trusts no stamp: none is listed.
        self._write_build_started(version, listed_from)
        # The disagreements first: kept alone, they still keep the version
        # from being found up to date (`up_to_date`).
        for path in (stamp_disagreements, dropped_sha256s):
            if path is not None and self.store.exists(path):
                self.store.move_files([path], folder)
        self.store.move_files(listing_files, folder)

    def stamp_disagreements(self, version: str) -> str:
        """Where the files `version`'s job found not as listed are kept
        (`STAMP_DISAGREEMENTS_FILE`, `stamp_disagreements`): a path that
        exists only when there were such files."""
        return storage.join(self.file_stamps_dir(version), STAMP_DISAGREEMENTS_FILE)

    def dropped_sha256s(self, version: str) -> str:
        """Where the sha256 and reason of each file `version`'s job read and
        dropped are kept (`DROPPED_SHA256S_FILE`,
        `up_to_date.write_dropped_sha256s`): a path that exists only for a
        version built since kiln kept them."""
        return storage.join(self.file_stamps_dir(version), DROPPED_SHA256S_FILE)

    def mark_verified(self, version: str, since: float) -> None:
        """Keeps `since` as `version`'s build start (`build_started`), when
        it is later than the one kept: every file its listing names that was
        last modified before `since` less `incremental.RACY_SECONDS` was
        read since then and found to hold its record's bytes (`up_to_date`).
        Hold the dataset's lock."""
        started = self.build_started(version)
        if started is not None and since > started:
            self._write_build_started(version, since)

    def _write_build_started(self, version: str, started: float) -> None:
        path = storage.join(self.file_stamps_dir(version), LISTED_FROM_FILE)
        self.store.write_atomic(path, f"{started!r}\n".encode())

    def versions(self) -> list[str]:
        """Names of the version folders, complete or not, sorted."""
        return [
            name
            for name in self.store.children(self.path)
            if not name.startswith(".") and name != LATEST_FILENAME
        ]

    def complete_versions(self, versions: Sequence[str]) -> set[str]:
        """Those of `versions` whose folder holds a kiln.json (`is_complete`
        of each; on an object store, the requests run concurrently)."""
        metadata = {storage.join(self.version_dir(v), METADATA_FILENAME): v for v in versions}
        return {metadata[path] for path in self.store.existing(list(metadata))}

    def staging_dirs(self) -> list[str]:
        """Staging folders of builds that did not finish (or are running)."""
        return [
            storage.join(self.path, name)
            for name in self.store.children(self.path)
            if name.startswith(STAGING_PREFIX)
        ]

    def new_listing_dir(self, clean: bool = True) -> str:
        """A fresh folder for a listing job's files (``source.listing: job``),
        after deleting what killed builds left in ``.listings/``.

        With `clean`, call it only while holding the dataset's lock: the
        folder of a running build looks the same as a dead one's. Without
        (a dry run, which holds no lock), it only names a folder.
        """
        listings = storage.join(self.path, LISTINGS_FOLDER)
        if clean:
            self.store.delete_tree(listings)
        return storage.join(listings, secrets.token_hex(4))

    def new_staging_dir(self, stamp: str) -> str:
        """A fresh, unique staging folder name next to the versions."""
        return storage.join(self.path, f"{STAGING_PREFIX}{stamp[:12]}-{secrets.token_hex(4)}")

    def clean_stale_staging(self) -> list[str]:
        """Deletes what killed or failed builds left behind: staging folders
        and temp files of small writes they did not finish.

        Call it only while holding the dataset's lock (`lock.DatasetLock`):
        a running build's staging folder looks the same as a dead one's.
        """
        stale = self.staging_dirs()
        for directory in stale:
            logger.info("deleting the stale staging folder %s", directory)
            self.store.delete_tree(directory)
        for folder in (
            self.path,
            storage.join(self.path, STAMPS_FOLDER),
            storage.join(self.path, PUBLISHED_FOLDER),
        ):
            stale += self.store.clean_temp_files(folder)
        return stale

    def clean_leftovers(self) -> list[str]:
        """Deletes what interrupted builds and prunes left behind: stale
        staging folders (`clean_stale_staging`) and incomplete version
        folders (`clean_incomplete_versions`). Returns what it deleted.

        Call it only while holding the dataset's lock (`lock.DatasetLock`).
        """
        return self.clean_stale_staging() + self.clean_incomplete_versions()

    def clean_incomplete_versions(self) -> list[str]:
        """Deletes the version folders without kiln.json, the publication
        records of versions that are not complete and the stamps and file
        stamps of those versions. Returns the folders and records deleted;
        logs a warning per folder.

        Under the dataset's lock only this build writes version folders, and
        it has not begun to, so such a folder is what an interrupted build
        left (killed while it copied its version, file by file, to an object
        store) or an interrupted prune (which deletes kiln.json first). No
        reader uses it: readers refuse a folder without kiln.json. Left
        alone: the version LATEST names, whatever its state (a reader
        following LATEST would fail either way; a rebuild of it replaces
        it), complete versions, and anything not named like a version
        (`kiln.schemas.location.is_version_name`).

        Call it only while holding the dataset's lock (`lock.DatasetLock`).
        """
        latest = self.latest()
        versions = self.versions()
        complete = self.complete_versions(versions)
        deleted = []
        for version in versions:
            if version in complete or version == latest or not is_version_name(version):
                continue
            directory = self.version_dir(version)
            logger.warning(
                "deleting the incomplete version folder %s (no %s: left by a build or prune "
                "that was interrupted)",
                directory,
                METADATA_FILENAME,
            )
            self.store.delete_tree(directory)
            deleted.append(version)
        # Their records, which send nobody anywhere: the publication marks
        # (named by version) and stamps (which hold it) of versions deleted
        # now, or whose folders a prune deleted before it was interrupted.
        # The stamps are read only then: they add up over the builds.
        published = storage.join(self.path, PUBLISHED_FOLDER)
        gone = {
            version
            for version in self.store.children(published)
            if not version.startswith(".") and version not in complete and version != latest
        }
        stale = [storage.join(published, version) for version in sorted(gone)]
        gone.update(deleted)
        if gone:
            stamps = self._small_files(storage.join(self.path, STAMPS_FOLDER))
            stale += [path for path, version in stamps.items() if version in gone]
        if stale:
            logger.info("deleting %d stamp(s) and record(s) of gone versions", len(stale))
            self.store.delete(stale)
        # The file stamps of versions that are not complete (gone, or a
        # build that stopped before its version was).
        stale_listings = [
            self.file_stamps_dir(version)
            for version in self.store.children(storage.join(self.path, FILE_STAMPS_FOLDER))
            if is_version_name(version) and version not in complete and version != latest
        ]
        for folder in stale_listings:
            self.store.delete_tree(folder)
        return [self.version_dir(version) for version in deleted] + stale + stale_listings

    def point_latest(self, version: str) -> None:
        """Makes LATEST name `version`, atomically and durably (its file and
        the folder's entry fsynced, locally): one line, ending in a newline
        (readers strip it, and accept LATEST files from before it had one)."""
        storage.write_text(storage.join(self.path, LATEST_FILENAME), version + "\n")
        # Published: a Ctrl-C or SIGTERM from now on waits for the build's end.
        interrupts.published()
        self.store.sync_folder(self.path)  # the rename of LATEST's new file, durable too

    def record_stamp(self, stamp: str, version: str) -> None:
        storage.write_text(storage.join(self.path, STAMPS_FOLDER, stamp), version)

    def record_published(self, version: str) -> None:
        """Notes that LATEST is about to name `version`: the newest publication.

        A sequence number rather than a clock time, so machines with skewed
        clocks (a laptop, then a scheduler) still order publications right.
        """
        marks = self._published_marks()
        storage.write_text(
            storage.join(self.path, PUBLISHED_FOLDER, version),
            f"{max(marks.values(), default=0) + 1}\n",
        )

    def latest_set_by_hand(self, version: str) -> str | None:
        """The version LATEST names, if someone pointed it there by hand
        after kiln had published `version` (a rollback), else None.

        That is: LATEST names another complete version; `version` is the
        one kiln published last (`record_published`); and LATEST was
        written after that record. A build of `version` leaves such a
        LATEST as it is: publishing `version` again would undo the
        rollback. Kiln's own states do not match: a version the publish
        gate held back was never published, and a build killed between
        recording a publication and writing LATEST left a LATEST older
        than the record.
        """
        latest = self.latest()
        if latest is None or latest == version or not self.is_complete(latest):
            return None
        marks = self._published_marks()
        if version not in marks or marks[version] != max(marks.values()):
            return None
        # What kiln itself last wrote into LATEST: anything else there was
        # written by hand, whatever its file's time (`cp -p` or `rsync -a`
        # of a saved LATEST keeps an old one). A build stopped between the
        # record and LATEST left LATEST as kiln last wrote it.
        named = self._read_small_file(storage.join(self.path, PUBLISHED_FOLDER, NAMED_FILE))
        if named is not None and named.strip():
            return latest if latest != named.strip() else None
        # Datasets published before kiln kept it: by the files' times.
        record = storage.join(self.path, PUBLISHED_FOLDER, version)
        written = self.store.modified_time(storage.join(self.path, LATEST_FILENAME))
        return latest if written > self.store.modified_time(record) else None

    def name_latest(self, version: str) -> None:
        """Points LATEST at `version` (if it names another), noting the
        publication first, and then that kiln wrote it (`NAMED_FILE`, which
        `latest_set_by_hand` tells a rollback by; noted again when missing
        or another, as after a build stopped just before noting it)."""
        if self.latest() != version:
            self.record_published(version)
            self.point_latest(version)
        named = storage.join(self.path, PUBLISHED_FOLDER, NAMED_FILE)
        if (self._read_small_file(named) or "").strip() == version:
            return
        try:
            storage.write_text(named, version + "\n")
        except Exception as e:  # published: rollbacks are told by the files' times
            logger.warning(
                "could not note that LATEST names %s in %s (%s: %s)",
                version,
                named,
                type(e).__name__,
                e,
            )
            with contextlib.suppress(Exception):
                self.store.delete([named])

    def _small_files(self, folder: str) -> dict[str, str]:
        """Path -> text of every file directly in `folder` (hidden temp files left out)."""
        paths = [
            storage.join(folder, name)
            for name in self.store.children(folder)
            if not name.startswith(".")
        ]
        return {path: (self._read_small_file(path) or "").strip() for path in paths}

    def _published_marks(self) -> dict[str, int]:
        """Version -> its publication's sequence number."""
        folder = storage.join(self.path, PUBLISHED_FOLDER)
        return {
            storage.basename(path): int(text)
            for path, text in self._small_files(folder).items()
            if text.isdigit()
        }

    def prune(self, keep: int, current_stamp: str | None = None) -> list[str]:
        """Deletes all but the `keep` most recently published complete versions,
        never the one LATEST names, and the input stamps no build can use
        again (`prune_stamps`). Returns the pruned version names.

        Recency is the order in which LATEST named them (`record_published`);
        versions published before kiln recorded it count as older than any that
        has a record, among themselves ordered by their kiln.json's time. Each
        version loses its kiln.json first, so a reader resolving it during the
        deletion gets "incomplete" rather than a missing shard. Folders without
        kiln.json are not counted: invisible to readers, they are deleted by
        the next build (`clean_incomplete_versions`), as is what a prune
        interrupted half-way leaves.
        """
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        latest = self.latest()
        marks = self._published_marks()
        versions = self.versions()
        complete = sorted(self.complete_versions(versions))

        def recency(version: str):
            if version in marks:
                return (1, marks[version], version)
            metadata = storage.join(self.version_dir(version), METADATA_FILENAME)
            return (0, self.store.modified_time(metadata), version)

        newest_first = sorted(complete, key=recency, reverse=True)
        kept = set(newest_first[:keep]) | ({latest} if latest else set())
        pruned = [v for v in newest_first if v not in kept]
        for version in pruned:
            logger.info("pruning version %s", version)
            directory = self.version_dir(version)
            self.store.delete([storage.join(directory, METADATA_FILENAME)])
            self.store.delete_tree(directory)
            self.store.delete([storage.join(self.path, PUBLISHED_FOLDER, version)])
            self.store.delete_tree(self.file_stamps_dir(version))
        self.prune_stamps(set(complete) - set(pruned), current_stamp)
        return pruned

    def prune_stamps(self, kept: set[str], current_stamp: str | None = None) -> list[str]:
        """Deletes the input stamps (``.stamps/``) no build can use again;
        returns their paths.

        Those are the stamps that name a version not in `kept` (pruned,
        deleted, or never complete), and the stamps of a kept version but
        its newest: every build whose files were touched, not changed,
        records another stamp of the same version (one a night, for a
        nightly build), and an older one describes modification times (and,
        locally, ctimes) that the files have left and cannot go back to.
        Kept: the newest stamp of each kept version (by the time it was
        written; all of them if tied) and `current_stamp`, the one this
        build was found up to date by or recorded. Hold the dataset's lock.
        """
        folder = storage.join(self.path, STAMPS_FOLDER)
        written = {
            metadata.path: float(metadata.last_updated_in_seconds)
            for metadata in self.store.list_tree(folder, skip_hidden=True)
        }
        named = {path: (self._read_small_file(path) or "").strip() for path in written}
        newest: dict[str, float] = {}
        for path, version in named.items():
            newest[version] = max(newest.get(version, written[path]), written[path])
        stale = [
            path
            for path, version in sorted(named.items())
            if storage.basename(path) != current_stamp
            and (version not in kept or written[path] < newest[version])
        ]
        if stale:
            logger.info("deleting %d input stamp(s) no build can use again", len(stale))
            self.store.delete(stale)
        return stale


_HASH_CHUNK_BYTES = 1 << 20


def recorded_files(info: DatasetInfo) -> dict[str, tuple[int | None, str]]:
    """File name -> (size or None, sha256): the files of a version whose
    bytes its kiln.json records (the shards, and the reports whose sha256 it
    holds)."""
    files: dict[str, tuple[int | None, str]] = {
        shard.filename: (shard.num_bytes, shard.sha256)
        for split in info.splits.values()
        for shard in split.shards
    }
    for name, sha256 in (
        (ERRORS_FILENAME, info.errors_sha256),
        (DUPLICATES_FILENAME, info.duplicates_sha256),
        (INDEX_FILENAME, info.index_sha256),
        (DROPPED_OBJECTS_FILENAME, info.dropped_objects_sha256),
    ):
        if sha256 is not None:
            files[name] = (None, sha256)
    return files


def _sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with FileSystems.open(path, compression_type="uncompressed") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def damaged_files(
    store: storage.Store, folder: str, info: DatasetInfo, checked: Mapping[str, str] | None = None
) -> dict[str, str]:
    """File name -> what is wrong with it, for the files of the version in
    `folder` that do not match its kiln.json (`info`): missing, another size,
    another sha256. `checked`: files already hashed against `info` (an
    incremental job's check of its base: name -> problem, "" when it
    matched), not read again; every other recorded file is read and hashed."""
    sizes = {storage.basename(m.path): m.size_in_bytes for m in store.list_tree(folder)}
    checked = checked or {}
    problems = {}
    for name, (size, sha256) in sorted(recorded_files(info).items()):
        if name not in sizes:
            problems[name] = f"{name} is missing"
        elif size is not None and sizes[name] != size:
            problems[name] = f"{name} has {sizes[name]} bytes, not {size}"
        elif name in checked:
            if checked[name]:
                problems[name] = checked[name]
        else:
            try:
                actual = _sha256_of(storage.join(folder, name))
            except Exception as e:  # unreadable: as damaged
                problems[name] = f"{name} cannot be read ({type(e).__name__})"
                continue
            if actual != sha256:
                problems[name] = f"{name}: sha256 differs from its kiln.json"
    return problems


class PublishTransaction:
    """Stage a build, then publish it whole or not at all.

    ::

        with PublishTransaction(dataset, stamp) as transaction:
            ...  # the job writes shards and errors.jsonl into transaction.staging_dir
            target = transaction.commit(info)

    Entering deletes what earlier builds left behind
    (`DatasetRoot.clean_leftovers`) and creates a unique staging folder
    name. `commit` writes the TFDS files, `kiln.json` last, moves the folder
    into place (or keeps an identical published copy, its files that do not
    match its kiln.json replaced by the staged ones), records the stamp and
    replaces LATEST, last of all. Leaving with an exception (Ctrl-C and
    SIGTERM included) deletes the staging folder, and the part of the version
    folder moved so far if the exception came while it was moved file by
    file (an object store), unless `keep_staging` asked to
    keep some of its files (a build that dropped too much keeps its
    errors.jsonl for the user to read, until the next build): everything
    else in it (shards, indexes, the job's work files) is deleted then.
    """

    def __init__(self, dataset: DatasetRoot, stamp: str):
        self.dataset = dataset
        self.stamp = stamp
        self.staging_dir = ""
        self._keep: tuple[str, ...] | None = None
        self._moving_to: str | None = None  # the version being moved into place
        self._file_stamps_of: str | None = None  # the version its listing was kept for

    @property
    def work_dir(self) -> str:
        """Inside the staging folder: the job's listing, temp files and report;
        deleted before publishing."""
        return storage.join(self.staging_dir, WORK_FOLDER)

    def __enter__(self) -> PublishTransaction:
        self.dataset.clean_leftovers()
        self.staging_dir = self.dataset.new_staging_dir(self.stamp)
        return self

    def keep_staging(self, only: Sequence[str]) -> None:
        """When the transaction fails, keep the staging folder with only the
        files named `only` (directly in it; see the class docstring)."""
        self._keep = tuple(only)

    def commit(
        self,
        info: DatasetInfo,
        gate: Callable[[str], None] | None = None,
        listing_files: Sequence[str] = (),
        listed_from: float = 0.0,
        dropped_sha256s: str | None = None,
        stamp_disagreements: str | None = None,
        checked: Mapping[str, str] | None = None,
    ) -> str:
        """Publishes the staged folder as `info.version`; returns its folder.

        LATEST is left as it is if it was pointed by hand at another
        version after `info.version` was last published
        (`DatasetRoot.latest_set_by_hand`: a rollback).

        Args:
          gate: Called with the version's folder once it is complete and
            its stamp recorded, before LATEST names it; an exception it
            raises leaves LATEST as it was and the complete version folder
            in place, to compare. The next build of the same inputs finds
            that version by its stamp without running a job: with the same
            gate it checks it again (the same verdict), without it publishes
            it (the launcher's up-to-date path).
          listing_files: The job's listing (in the work folder, or a
            listing job's folder), kept as the listing the version was
            built from (`DatasetRoot.record_file_stamps`), replacing an
            existing version's: the next build trusts the stamps of the
            files it lists. Failing to keep it is logged, not raised: the
            next build then reads the files whose stamps it lacks.
          listed_from: When the build started (before its job read any
            file), kept with the listing.
          dropped_sha256s: The job's file of the sha256 of the files it
            dropped (`DROPPED_SHA256S_FILE`, in the work folder), kept with
            the listing.
          stamp_disagreements: The job's file of the files it read that were
            not as listed (`STAMP_DISAGREEMENTS_FILE`, in the work folder,
            when there were such files), kept with the listing: the next
            build trusts neither the version nor those files' stamps.
          checked: When `info.version` is already published: its files the
            job already hashed against its kiln.json (the base's check, the
            base being that version), name -> problem ("" when it matched).
            Its other files are checked now (`damaged_files`); those that
            are missing or damaged are replaced by the staged copy's
            (`_repair`), each atomically; its TFDS metadata files that
            differ from its kiln.json are written again from it
            (`repair_tfds_metadata`).
        """
        store = self.dataset.store
        if listing_files:
            self._file_stamps_of = info.version
            try:
                self.dataset.record_file_stamps(
                    info.version, listing_files, listed_from, dropped_sha256s, stamp_disagreements
                )
            except Exception as e:  # the next build reads and hashes every file
                logger.warning(
                    "could not keep the listing of version %s (%s: %s): the next build "
                    "reads and hashes every file",
                    info.version,
                    type(e).__name__,
                    e,
                )
        store.delete_tree(self.work_dir)
        write_tfds_metadata(self.staging_dir, info)  # TFDS-readable too
        # kiln.json last: its presence marks the folder complete.
        storage.write_text(storage.join(self.staging_dir, METADATA_FILENAME), info.dumps())
        target = self.dataset.version_dir(info.version)
        existing = self.dataset.read_info(info.version)
        if existing is not None:
            # Same content and config as an existing version (e.g. the files
            # were touched): same bytes, keep the published copy, repaired
            # where its files are not what its kiln.json says.
            logger.info("version %s already exists; reusing it", info.version)
            damaged = damaged_files(store, target, existing, checked)
            if damaged:
                self._repair(info, existing, damaged)
            # Not recorded in kiln.json, so not among `damaged`: made from it.
            repair_tfds_metadata(target, existing)
            store.delete_tree(self.staging_dir)
        else:
            # An incomplete folder of this version (a copy interrupted on an
            # object store) is replaced.
            store.delete_tree(target)
            self._moving_to = info.version
            # On disk before LATEST may name it: after a power loss, LATEST
            # must not name a folder whose files were still in the page
            # cache (one pass; nothing on an object store).
            store.sync_tree(self.staging_dir)
            store.move_tree(self.staging_dir, target, last=METADATA_FILENAME)
            store.sync_folder(self.dataset.path)  # the rename itself
            self._moving_to = None
            store.delete_tree(self.staging_dir)
        self.dataset.record_stamp(self.stamp, info.version)
        if self.dataset.latest_set_by_hand(info.version) is not None:
            # The same version as one LATEST was rolled back from (a file
            # touched, the same bytes): the rollback stands.
            logger.info("LATEST was set by hand: left as is")
            return target
        if gate is not None:
            gate(target)
        self.dataset.name_latest(info.version)  # last of all
        return target

    def _repair(self, info: DatasetInfo, existing: DatasetInfo, damaged: Mapping[str, str]) -> None:
        """Replaces the published version's `damaged` files with the staged
        copy's, each with one rename (atomic locally; one object write on an
        object store), its kiln.json kept: the staged files are the same
        bytes (the same version) as it records, checked against `info`."""
        store = self.dataset.store
        target = self.dataset.version_dir(info.version)
        staged = recorded_files(info)
        recorded = recorded_files(existing)
        names = sorted(name for name in damaged if staged.get(name) == recorded[name])
        left = sorted(set(damaged) - set(names))
        if left:  # not the same bytes: cannot happen for one version id
            logger.warning(
                "cannot repair %s: the build's copy of %s differs from its kiln.json",
                target,
                ", ".join(left),
            )
        if not names:
            return
        paths = [storage.join(self.staging_dir, name) for name in names]
        store.sync_tree(self.staging_dir)
        store.move_files(paths, target)
        store.sync_folder(target)
        logger.warning(
            "repaired version %s: replaced %d damaged file(s) with this build's copy: %s",
            info.version,
            len(names),
            "; ".join(damaged[name] for name in names),
        )

    def _delete_all_but(self, names: Sequence[str]) -> None:
        """Deletes everything in the staging folder but the files `names`."""
        store = self.dataset.store
        for name in store.children(self.staging_dir):
            if name not in names:
                path = storage.join(self.staging_dir, name)
                store.delete_tree(path)  # a folder (locally, a file too)
                store.delete([path])  # a file on an object store

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        if kind is None:
            return
        try:
            # Stopped while its folder was moved file by file (an object
            # store): the part already moved is not a version, and would
            # stay until the next build.
            version = self._moving_to
            if version is not None and not self.dataset.is_complete(version):
                logger.info("deleting the partial copy %s", self.dataset.version_dir(version))
                self.dataset.store.delete_tree(self.dataset.version_dir(version))
            # The listing kept for a version that did not become complete.
            stamped = self._file_stamps_of
            if stamped is not None and not self.dataset.is_complete(stamped):
                self.dataset.store.delete_tree(self.dataset.file_stamps_dir(stamped))
            if self._keep is None:
                self.dataset.store.delete_tree(self.staging_dir)
            else:
                self._delete_all_but(self._keep)
        except Exception:  # keep the original error; the next build cleans up
            logger.warning(
                "could not delete the staging folder %s (or the partial copy of its version)",
                self.staging_dir,
                exc_info=True,
            )
