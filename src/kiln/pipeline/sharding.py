"""Deterministic sharding: which records go in which shard, in what order.

Every record has a sort key, a 64-bit hash of its stable key. A split with
``n`` shards gives shard ``i`` the hash range ``[i * 2**64 / n, (i+1) * 2**64 / n)``
and each shard is sorted by hash, so reading the shards in order reads the
whole split in hash order (as TFDS does): the global order holds across
shards, and neither the runner, the number of workers nor the listing order
can change a byte. The number of shards per split is fixed in the config or
``ceil(split bytes / target_shard_mb)`` (at most one per record), computed in
the job from the encoded records, so shards come out near the target size.

Shards are written by `WriteShardFn`, not Beam's WriteToTFRecord, which
decides shard contents and order itself. Each shard is written to a unique
temp name and then renamed, so a bundle Beam retries (or runs twice) leaves
exactly one complete, correct file; an interrupted attempt leaves only a
temp file, which the launcher deletes.

The records themselves do not go through Beam's shuffle: an external merge
sort. A `RunWriter` (inside the job's image step, `images.ProcessImagesFn`)
collects up to one shard's worth of records, sorts them by (split, hash)
and writes them to a temp "run" file already framed as in a shard (TFRecord
length, CRCs), each frame followed by its line of the version's record index
(`record_index`), passing on only the run's index
(`SpilledRun`: each record's split, hash, offset and lengths).
In a run, a shard's records are one contiguous byte range (a hash range of
a split), so each run is cut into at most one `RunSlice` per shard, and
shards are grouped from those slices; `WriteShardFn` reads each slice in
one go and writes the frames from those reads as they are (views into
them, not copies: a shard's records are held once). So the build's memory
stays near one shard per shard-writing thread however large the dataset
(Beam's local runner holds a shuffled collection in memory, and records
are images), Dataflow shuffles a few dozen bytes per image instead of the
image, and after the spill no
Beam step handles single records (each step an element passes through
costs time on the bundle's thread). The run files stay in the job's work
folder, which the launcher deletes once the job is done.

An incremental build's reused records (`kiln.pipeline.incremental`) skip
the runs: they are already framed in the base version's shards, so the
image step passes on where they are (`ReusedRun`: split, hash, offset and
frame length per record), they are sliced per shard like runs
(`ReusedSlice`), and `WriteShardFn` copies their frames from the base shard
(a read per range of neighbouring frames; a gzip shard in one forward
inflate, `read_reused`), checking each frame's length and CRCs, and merges
them with the new records by hash. Records relabelled (`relabel`: a class
added or removed shifted the class ids) travel the same way, their runs
marked ``relabelled``: the shard writer rewrites their ids in the copied
frame (`relabel.FrameRelabel`) after checking it.

Beside each shard `WriteShardFn` writes the shard's part of the record
index (one line per record, in shard order) to the temp folder
(`index_part_path`); the job's last step joins the parts into the
version's ``index.jsonl`` (`record_index.join_parts`).
"""

from __future__ import annotations

import concurrent.futures
import gzip
import hashlib
import logging
import math
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from kiln.pipeline import incremental, memory, record_index, storage, tfrecord
from kiln.schemas import ShardInfo, shard_filename

if TYPE_CHECKING:
    from kiln.pipeline.config import ShardingConfig
    from kiln.pipeline.relabel import FrameRelabel

logger = logging.getLogger(__name__)

_MB = 1 << 20
_MAX_RUN_MB = 64.0


class RunSlice(NamedTuple):
    """One shard's records in one run file: consecutive, starting at byte ``start``."""

    run: str
    start: int
    # (sort_key, record length, index entry length) of each record, in file
    # order; each record's frame (`tfrecord.framed_size` of its length) is
    # followed by its index entry's bytes.
    entries: tuple[tuple[str, int, int], ...]


class ReusedSlice(NamedTuple):
    """One shard's records kept from one base shard (`ReusedRun`), framed there."""

    source: str  # the base shard file
    compression: str | None  # its compression (offsets are in its uncompressed bytes)
    # (sort_key, offset, framed length, index entry) of each record, sorted.
    entries: tuple[tuple[str, int, int, bytes], ...]
    relabelled: bool = False  # class ids to rewrite as they are copied (`ReusedRun`)


class SpilledRun(NamedTuple):
    """A run file, its records' ``(split, sort_key, offset, length,
    index_length)`` in file order (the record's TFRecord frame at
    ``offset``, ``length`` the record's own size, its `record_index` entry
    right after the frame), and in the same order each
    record's ``(source file's sha256, key)`` (for `duplicates.FindDuplicates`)."""

    run: str
    entries: tuple[tuple[str, str, int, int, int], ...]
    contents: tuple[tuple[str, str], ...]


class ReusedRun(NamedTuple):
    """Records an incremental build keeps from one shard of its base version
    (`kiln.pipeline.incremental`): not written to a run file, since they are
    already framed in the base shard (``source``); `WriteShardFn` copies
    their bytes from there. ``entries`` are ``(split, sort_key, offset,
    framed length, index entry)``, sorted, the offset and length those of
    the record's TFRecord frame in the base shard's uncompressed bytes;
    ``contents`` are ``(source file's sha256, key)`` in the same order, as in
    a `SpilledRun`.

    ``relabelled``: the records' class ids are the base's, to be mapped to
    this build's as they are copied (`relabel.FrameRelabel`, which keeps
    their length: the framed lengths are the new records' too); their
    index entries are this build's already."""

    source: str
    compression: str | None
    entries: tuple[tuple[str, str, int, int, bytes], ...]
    contents: tuple[tuple[str, str], ...]
    relabelled: bool = False


def sort_key(key: str) -> str:
    """The record's position in the split: first 64 bits of sha256(key), hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def shard_index(sort_key_hex: str, num_shards: int) -> int:
    """The shard whose hash range holds `sort_key_hex`."""
    return (int(sort_key_hex, 16) * num_shards) >> 64


def count_shards(split: str, num_records: int, num_bytes: int, sharding: ShardingConfig) -> int:
    """Shards for a split: fixed by the config, else by the target size; never
    more than the split has records (``num_shards: 100000`` for two images
    writes two shards, not 99,998 empty files; the launcher says so).

    Args:
      split: Split name (a fixed count may be given per split).
      num_records: Records in the split.
      num_bytes: Bytes the split's records take in TFRecord framing.
      sharding: The ``sharding`` config.
    """
    fixed = sharding.num_shards
    if isinstance(fixed, Mapping):
        fixed = fixed.get(split)
    if fixed:
        return max(1, min(int(fixed), num_records))
    target = sharding.target_shard_mb * _MB
    return max(1, min(num_records, math.ceil(num_bytes / target)))


class _HashingWriter:
    """A write-only file wrapper that counts and hashes what passes through."""

    def __init__(self, raw):
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def write(self, data) -> int:
        self._raw.write(data)
        self.sha256.update(data)
        self.num_bytes += len(data)
        return len(data)

    def flush(self) -> None:
        pass  # the raw file is flushed when closed


def write_frames(
    path: str, temp_path: str, frames: Sequence[bytes | memoryview], compression: str
) -> ShardInfo:
    """Writes TFRecord `frames` (`tfrecord.frame`) in order as a file at
    `path`, via `temp_path`.

    Gzip output has a fixed header (no file name, mtime 0), so the bytes are
    deterministic for a given zlib.
    """
    with storage.create(temp_path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        counted = _HashingWriter(raw)
        if compression == "gzip":
            with gzip.GzipFile(filename="", mode="wb", fileobj=counted, mtime=0) as sink:
                for framed in frames:
                    sink.write(framed)
        else:
            # About a MB at a time: a write and a hash update per MB instead
            # of per record, with little more memory.
            batch: list[bytes | memoryview] = []
            batched = 0
            for framed in frames:
                batch.append(framed)
                batched += len(framed)
                if batched >= _MB:
                    counted.write(b"".join(batch))
                    batch, batched = [], 0
            if batch:
                counted.write(b"".join(batch))
    # Rename replaces a file a previous attempt left (same bytes): one file.
    FileSystems.rename([temp_path], [path])
    return ShardInfo(
        filename=path.rsplit("/", 1)[-1],
        num_records=len(frames),
        num_bytes=counted.num_bytes,
        sha256=counted.sha256.hexdigest(),
    )


def run_bytes(sharding: ShardingConfig) -> int:
    """How many bytes of records a sorted run holds at most: one shard's
    worth, and at most 64 MB (a Dataflow worker runs a DoFn instance per
    thread, each with its own buffer)."""
    return max(1, int(min(sharding.target_shard_mb, _MAX_RUN_MB) * _MB))


class RunWriter:
    """Buffers records per window and writes them out as sorted runs.

    `add` returns True once the buffered records reach `run_bytes`; `flush`
    then sorts each window's records by (split, sort_key, record), writes
    them framed (`tfrecord.header_and_footer`: the shard writer copies the
    frames as they are), each followed by its index entry, to a new file in
    `folder` under a unique name (a retried bundle writes new files; the
    failed attempt's are never referenced) and yields
    one `SpilledRun` per file, as a WindowedValue in its window (so it can
    be emitted from ``finish_bundle`` too).
    """

    def __init__(self, folder: str, run_bytes: int):
        self._folder = folder
        self._run_bytes = max(1, int(run_bytes))
        self._buffers: dict = {}
        self._buffered = 0

    def reset(self) -> None:
        """Forgets the buffered records (a failed bundle's)."""
        self._buffers = {}
        self._buffered = 0

    def add(
        self,
        window,
        split: str,
        key: str,
        record: bytes,
        content: str,
        source_key: str,
        index_entry: bytes = b"",
    ) -> bool:
        """Buffers one record: `key` is its sort key, `content` its source
        file's sha256, `source_key` its key, `index_entry` what the record
        index keeps of it (`record_index.entry`)."""
        self._buffers.setdefault(window, []).append(
            (split, key, record, content, source_key, index_entry)
        )
        self._buffered += len(record) + len(index_entry)
        return self._buffered >= self._run_bytes

    def flush(self):
        buffers = self._buffers
        self.reset()
        for window, records in buffers.items():
            records.sort()
            run = FileSystems.join(self._folder, f"run-{uuid.uuid4().hex}")
            entries = []
            offset = 0
            with storage.create(run, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                # About a MB per write, not two writes per record.
                batch: list[bytes] = []
                batched = 0
                for split, key, data, _, _, index_entry in records:
                    header, footer = tfrecord.header_and_footer(data)
                    batch += (header, data, footer, index_entry)
                    entries.append((split, key, offset, len(data), len(index_entry)))
                    size = tfrecord.framed_size(len(data)) + len(index_entry)
                    offset += size
                    batched += size
                    if batched >= _MB:
                        f.write(b"".join(batch))
                        batch, batched = [], 0
                if batch:
                    f.write(b"".join(batch))
            contents = tuple((content, source_key) for _, _, _, content, source_key, _ in records)
            yield WindowedValue(
                SpilledRun(run, tuple(entries), contents), window.max_timestamp(), (window,)
            )


def _split_totals(run: SpilledRun | ReusedRun):
    """(split, (records, bytes in TFRecord framing)) for each split in a run."""
    totals: dict[str, list[int]] = {}
    framed = isinstance(run, ReusedRun)
    for split, _, _, length, _ in run.entries:
        total = totals.setdefault(split, [0, 0])
        total[0] += 1
        total[1] += length if framed else tfrecord.framed_size(length)
    for split, (records, num_bytes) in totals.items():
        yield split, (records, num_bytes)


def _slices_by_shard(run: SpilledRun | ReusedRun, num_shards: Mapping[str, int]):
    """((split, index, num_shards), RunSlice or ReusedSlice) for each shard
    with records in `run`."""
    if isinstance(run, ReusedRun):
        yield from _reused_slices(run, num_shards)
        return
    shard: tuple[str, int, int] | None = None
    start = 0
    entries: list[tuple[str, int, int]] = []
    for split, key, offset, length, index_length in run.entries:  # sorted by (split, key)
        n = num_shards[split]
        this = (split, shard_index(key, n), n)
        if this != shard:
            if entries:
                yield shard, RunSlice(run.run, start, tuple(entries))
            shard, start, entries = this, offset, []
        entries.append((key, length, index_length))
    if entries:
        yield shard, RunSlice(run.run, start, tuple(entries))


def _reused_slices(run: ReusedRun, num_shards: Mapping[str, int]):
    shard: tuple[str, int, int] | None = None
    entries: list[tuple[str, int, int, bytes]] = []
    for split, key, offset, length, index_entry in run.entries:  # sorted by (split, key)
        n = num_shards[split]
        this = (split, shard_index(key, n), n)
        if this != shard:
            if entries:
                yield (
                    shard,
                    ReusedSlice(run.source, run.compression, tuple(entries), run.relabelled),
                )
            shard, entries = this, []
        entries.append((key, offset, length, index_entry))
    if entries:
        yield shard, ReusedSlice(run.source, run.compression, tuple(entries), run.relabelled)


# Reading a base shard, a gap of less than this between two wanted frames
# is read through rather than seeked over.
_READ_THROUGH_BYTES = 1 << 20


def _spans(entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges that cover the ``(offset, length)``
    frames, sorted by offset: neighbours and small gaps in one range."""
    spans: list[list[int]] = []
    for offset, length in sorted(entries):
        if spans and offset - spans[-1][1] < _READ_THROUGH_BYTES:
            spans[-1][1] = max(spans[-1][1], offset + length)
        else:
            spans.append([offset, offset + length])
    return [(start, end) for start, end in spans]


def read_reused(
    slices: list[ReusedSlice], relabel: FrameRelabel | None = None
) -> list[tuple[str, bytes | memoryview, bytes]]:
    """``(sort_key, framed record, index entry)`` of every record in `slices`,
    copied from their base shards. Each frame's length and data CRC are
    checked (the base was checked before the image step decided to reuse
    it; a file changed since fails here); then the frames of a
    ``relabelled`` slice have their class ids rewritten by `relabel` (a
    new frame each, of the same length).

    An uncompressed base shard is read a range of neighbouring frames at a
    time, each frame a view into its read. A gzip one is read in one
    forward pass (`incremental.open_base_shard`), its wanted frames in
    ascending offset, each a copy of its bytes: memory holds the wanted
    frames and an inflate buffer of about a MB, never the shard, and the
    pass stops after the last wanted frame. Each call makes its own pass
    over each gzip base shard it copies from, so a base shard is inflated
    at most once per new shard that copies from it (`WriteShardFn` counts
    the passes, ``base_shard_inflations``). As a shard's records are a hash
    range, those are the one or few new shards of its split whose ranges
    overlap its own (more only where records changed split: new fractions
    or salt): about one pass per base shard when the shard count did not
    change. Sharing one pass between new shards would mean moving their
    records through Beam's shuffle instead.

    Raises:
      OSError: a frame is not where the base's check found it, a gzip
        shard does not inflate, or a relabelled record's ids cannot be
        mapped (it is not the record the base's index says).
    """
    by_source: dict[tuple[str, str | None], list[tuple[str, int, int, bytes, bool]]] = {}
    for piece in slices:
        if piece.relabelled and relabel is None:
            raise ValueError(f"{piece.source}: records to relabel, without the class id map")
        by_source.setdefault((piece.source, piece.compression), []).extend(
            (*entry, piece.relabelled) for entry in piece.entries
        )
    out: list[tuple[str, bytes | memoryview, bytes]] = []
    for (source, compression), entries in sorted(by_source.items()):
        copied = _Copier(source, relabel)
        if compression == "gzip":
            _inflated_frames(source, entries, copied)
        else:
            _plain_frames(source, entries, copied)
        out.extend(copied.frames)
    return out


class _Copier:
    """Collects the frames `read_reused` copies from one base shard: checks
    each, and rewrites the class ids of a relabelled one."""

    def __init__(self, source: str, relabel: FrameRelabel | None):
        self.source = source
        self.relabel = relabel
        self.frames: list[tuple[str, bytes | memoryview, bytes]] = []

    def add(
        self,
        key: str,
        framed: bytes | memoryview,
        index_entry: bytes,
        offset: int,
        length: int,
        relabelled: bool,
    ) -> None:
        if not tfrecord.is_frame(framed):
            raise OSError(
                f"{self.source}: no intact record of {length} bytes at offset {offset} "
                "(the file changed after its check)"
            )
        if relabelled and self.relabel is not None:
            try:
                framed = self.relabel.frame(framed)
            except ValueError as e:
                raise OSError(
                    f"{self.source}: the record at offset {offset} cannot be relabelled ({e})"
                ) from e
        self.frames.append((key, framed, index_entry))


def _plain_frames(
    source: str, entries: list[tuple[str, int, int, bytes, bool]], copied: _Copier
) -> None:
    """`read_reused` of an uncompressed base shard: a read per `_spans` range."""
    spans = {}
    with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        for start, end in _spans([(offset, length) for _, offset, length, _, _ in entries]):
            f.seek(start)
            spans[(start, end)] = f.read(end - start)
    ordered = sorted(spans)
    span_index = 0
    for key, offset, length, index_entry, relabelled in sorted(entries, key=lambda e: e[1]):
        while ordered[span_index][1] < offset + length:
            span_index += 1
        start = ordered[span_index][0]
        framed = memoryview(spans[ordered[span_index]])[offset - start : offset - start + length]
        copied.add(key, framed, index_entry, offset, length, relabelled)


def _inflated_frames(
    source: str, entries: list[tuple[str, int, int, bytes, bool]], copied: _Copier
) -> None:
    """`read_reused` of a gzip base shard: one forward pass, ascending offsets."""
    try:
        with incremental.open_base_shard(source, "gzip") as f:
            for key, offset, length, index_entry, relabelled in sorted(entries, key=lambda e: e[1]):
                f.seek(offset)
                copied.add(key, f.read(length), index_entry, offset, length, relabelled)
    except zlib.error as e:
        raise OSError(f"{source}: does not inflate ({e}; the file changed after its check)") from e


def read_run_frames(slices: list[RunSlice]) -> list[tuple[str, memoryview, bytes]]:
    """``(sort_key, framed record, index entry)`` of every record in `slices`;
    one read per slice, each frame a view into it (the records are held
    once, not copied out of the read and again into frames)."""
    out = []
    for piece in sorted(slices):
        size = sum(
            tfrecord.framed_size(length) + index_length for _, length, index_length in piece.entries
        )
        with FileSystems.open(piece.run, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.seek(piece.start)
            span = f.read(size)
        if len(span) != size:
            raise OSError(
                f"{piece.run}: expected {size} bytes at offset {piece.start}, "
                f"read {len(span)} (the run file was truncated or replaced)"
            )
        view = memoryview(span)
        offset = 0
        for key, length, index_length in piece.entries:
            end = offset + tfrecord.framed_size(length)
            out.append((key, view[offset:end], span[end : end + index_length]))
            offset = end + index_length
    return out


def index_part_path(temp_folder: str, shard_file: str) -> str:
    """Where `WriteShardFn` leaves a shard's part of the record index."""
    return FileSystems.join(temp_folder, f"index-{shard_file}")


class WriteShardFn(beam.DoFn):
    """((split, index, num_shards), [RunSlice, ReusedSlice or None]) -> (split, index, ShardInfo).

    None values mark a shard that must exist even if its hash range holds no
    record, so a split always has all its ``-of-N`` files. Holds one shard's
    records in memory, read from the runs (and, in an incremental build,
    copied framed from the base's shards) and sorted, after handing what
    the process freed so far back to the system
    (`memory.release_free_memory`). Also writes the shard's part of the
    record index (`index_part_path`), via a temp name.

    With `threads` > 1, up to that many shards are written at once on a
    thread pool (reading, hashing, checking CRCs and writing release the
    GIL), their results emitted as they finish or when the bundle ends;
    memory then holds up to `threads` shards. Counters are incremented on
    the bundle's thread, where Beam's metrics live.

    `relabel` rewrites the class ids of the records of ``relabelled``
    slices as they are copied (`read_reused`); None when the build
    relabels none that way.
    """

    def __init__(
        self,
        folder: str,
        temp_folder: str,
        name: str,
        compression: str,
        threads: int = 1,
        relabel: FrameRelabel | None = None,
    ):
        self._folder = folder
        self._temp_folder = temp_folder
        self._name = name
        self._compression = compression
        self._threads = max(1, int(threads))
        self._relabel = relabel
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: dict[concurrent.futures.Future, tuple] = {}
        self._shards = Metrics.counter("kiln", "shards_written")
        self._records = Metrics.counter("kiln", "records_written")
        self._copied = Metrics.counter("kiln", "records_copied")
        self._inflations = Metrics.counter("kiln", "base_shard_inflations")

    def setup(self):
        if self._threads > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="kiln-shard"
            )

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def start_bundle(self):
        self._pending = {}

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        if self._pool is None:
            result = self._write(element)
            self._count(result)
            yield result[0]
            return
        self._pending[self._pool.submit(self._write, element)] = (window, timestamp)
        yield from self._take_done(wait=len(self._pending) >= self._threads)

    def finish_bundle(self):
        while self._pending:
            yield from self._take_done(wait=True)

    def _take_done(self, wait: bool):
        if wait:
            concurrent.futures.wait(self._pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in [future for future in self._pending if future.done()]:
            window, timestamp = self._pending.pop(future)
            result = future.result()
            self._count(result)
            yield WindowedValue(result[0], timestamp, (window,))

    def _count(self, result) -> None:
        (_, _, info), copied, inflations = result
        self._shards.inc()
        self._records.inc(info.num_records)
        if copied:
            self._copied.inc(copied)
        if inflations:
            self._inflations.inc(inflations)

    def _write(self, element) -> tuple[tuple[str, int, ShardInfo], int, int]:
        """Writes one shard: ((split, index, ShardInfo), records copied from a
        base, gzip base shards inflated for them: one pass each, `read_reused`)."""
        (split, index, num_shards), values = element
        # What the image step's threads (and the shard before) freed goes
        # back to the system before this shard is read (`memory`).
        memory.release_free_memory()
        runs = [v for v in values if isinstance(v, RunSlice)]
        reused = [v for v in values if isinstance(v, ReusedSlice)]
        ordered = _merge(read_run_frames(runs), read_reused(reused, self._relabel))
        filename = shard_filename(
            self._name,
            split,
            index,
            num_shards,
            self._compression if self._compression != "none" else None,
        )
        info = write_frames(
            path=FileSystems.join(self._folder, filename),
            temp_path=FileSystems.join(self._temp_folder, f"{filename}.{uuid.uuid4().hex}"),
            frames=[framed for _, framed, _ in ordered],
            compression=self._compression,
        )
        part = index_part_path(self._temp_folder, filename)
        record_index.write_part(
            part,
            f"{part}.{uuid.uuid4().hex}",
            split,
            filename,
            [index_entry for _, _, index_entry in ordered],
        )
        inflated = {piece.source for piece in reused if piece.compression == "gzip"}
        return (split, index, info), sum(len(piece.entries) for piece in reused), len(inflated)


def _merge(
    *parts: Sequence[tuple[str, bytes | memoryview, bytes]],
) -> list[tuple[str, bytes | memoryview, bytes]]:
    """``(sort_key, framed record, index entry)`` in shard order: by sort
    key, then record bytes, then index entry (what sorting the
    ``(sort_key, record, index entry)`` tuples gives; equal sort keys are
    rare, so the frames are only cut open for those)."""
    merged = sorted((item for part in parts for item in part), key=lambda item: item[0])
    start = 0
    while start < len(merged):
        end = start + 1
        while end < len(merged) and merged[end][0] == merged[start][0]:
            end += 1
        if end - start > 1:
            merged[start:end] = sorted(
                merged[start:end], key=lambda item: (bytes(tfrecord.unframe(item[1])), item[2])
            )
        start = end
    return merged


def _all_shards(split_and_count):
    split, n = split_and_count
    for index in range(n):
        yield (split, index, n), None


class ShardRuns(beam.PTransform):
    """Shards, orders and writes the records of sorted runs, every split.

    Input: PCollection[SpilledRun or ReusedRun] (from `RunWriter`, and the
    image step of an incremental build). Output: PCollection[(split, index,
    ShardInfo)], one per shard file written to `folder`. The run files are
    left in place: they live in the job's work folder, which the launcher
    deletes after the job.

    Args:
      folder: Where the shard files go.
      temp_folder: Where they are written first (same filesystem).
      name: Dataset name, the first part of the file names.
      sharding: The ``sharding`` config.
      threads: Shards written at once per DoFn instance (`WriteShardFn`).
      relabel: Rewrites the class ids of relabelled records as they are
        copied (`WriteShardFn`), or None.
    """

    def __init__(
        self,
        folder: str,
        temp_folder: str,
        name: str,
        sharding: ShardingConfig,
        threads: int = 1,
        relabel: FrameRelabel | None = None,
    ):
        super().__init__()
        self._folder = folder
        self._temp_folder = temp_folder
        self._name = name
        self._sharding = sharding
        self._threads = threads
        self._relabel = relabel

    def expand(self, runs):
        sharding = self._sharding
        num_shards = (
            runs
            | "MeasureRuns" >> beam.FlatMap(_split_totals)
            # (split, (records, framed bytes)) per run
            | "SumPerSplit" >> beam.CombinePerKey(beam.combiners.TupleCombineFn(sum, sum))
            # (split, (records, bytes))
            | "CountShards"
            >> beam.MapTuple(
                lambda split, totals: (split, count_shards(split, totals[0], totals[1], sharding))
            )
            # (split, num_shards)
        )
        keyed = runs | "SliceRuns" >> beam.FlatMap(
            _slices_by_shard, num_shards=beam.pvalue.AsDict(num_shards)
        )  # ((split, index, num_shards), RunSlice)
        every_shard = num_shards | "ListShards" >> beam.FlatMap(_all_shards)
        # ((split, index, num_shards), None)
        return (
            (keyed, every_shard)
            | "MergeShardMarkers" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            # ((split, index, num_shards), [RunSlice, ReusedSlice or None])
            | "WriteShardFiles"
            >> beam.ParDo(
                WriteShardFn(
                    self._folder,
                    self._temp_folder,
                    self._name,
                    sharding.compression,
                    self._threads,
                    self._relabel,
                )
            )
            # (split, index, ShardInfo)
        )
