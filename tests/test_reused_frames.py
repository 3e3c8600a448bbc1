"""Reused records as byte ranges of a base shard: the base check finds each
record's frame, and the shard writer copies the frames straight into the new
shard, checking each, in the order a full build sorts records in."""

import array
import hashlib
import itertools
import os
import random
import re
import tracemalloc

import pytest

from kiln.pipeline import incremental, sharding, tfrecord


def records(n, size=50):
    return [f"record-{i:04d}:".encode() + bytes([i % 251]) * (size + i % 7) for i in range(n)]


def write_base_shard(tmp_path, name, data, compression="none"):
    path = str(tmp_path / name)
    frames = [tfrecord.frame(record) for record in data]
    info = sharding.write_frames(path, str(tmp_path / f"{name}.tmp"), frames, compression)
    return path, info


def check(tmp_path, name, sha256, compression=None):
    return incremental._check_file((name, sha256), str(tmp_path), compression)


def test_a_frame_is_intact_only_with_its_length_and_both_crcs():
    framed = tfrecord.frame(b"some record bytes")
    assert tfrecord.is_frame(framed) and tfrecord.unframe(framed) == b"some record bytes"
    assert tfrecord.is_frame(tfrecord.frame(b""))
    data_flipped = framed[:14] + bytes([framed[14] ^ 1]) + framed[15:]
    crc_flipped = framed[:9] + bytes([framed[9] ^ 1]) + framed[10:]
    assert not tfrecord.is_frame(data_flipped)
    assert not tfrecord.is_frame(crc_flipped)
    assert not tfrecord.is_frame(framed[:-1])  # the length says more
    assert not tfrecord.is_frame(framed + tfrecord.frame(b"x"))  # two frames
    assert not tfrecord.is_frame(framed[:10])


@pytest.mark.parametrize("chunk", [1, 5, 12, 13, 100, 1 << 20])
def test_the_frame_scanner_finds_every_frame_however_the_bytes_arrive(chunk):
    data = records(40)
    raw = b"".join(tfrecord.frame(r) for r in data)
    scanner = incremental._FrameScanner()
    for start in range(0, len(raw), chunk):
        scanner.feed(raw[start : start + chunk])
    starts = incremental.frame_starts(scanner.frames())
    assert len(starts) == len(data) + 1 and starts[-1] == len(raw)
    assert [tfrecord.unframe(raw[a:b]) for a, b in itertools.pairwise(starts)] == data


def test_the_base_check_finds_the_frames_of_plain_and_gzip_shards(tmp_path):
    data = records(30)
    for compression, name in (("none", "plain"), ("gzip", "zipped")):
        _, info = write_base_shard(tmp_path, name, data, compression)
        got_name, (problem, frames) = check(
            tmp_path, name, info.sha256, None if compression == "none" else "gzip"
        )
        assert (got_name, problem) == (name, "")
        raw = b"".join(tfrecord.frame(r) for r in data)
        starts = incremental.frame_starts(frames)
        assert [tfrecord.unframe(raw[a:b]) for a, b in itertools.pairwise(starts)] == data


def test_the_base_check_does_not_trust_a_shard_that_is_not_kilns_framing(tmp_path):
    # Its sha256 matches kiln.json, yet it ends inside a record.
    raw = b"".join(tfrecord.frame(r) for r in records(3))[:-3]
    (tmp_path / "cut").write_bytes(raw)
    _, (problem, frames) = check(tmp_path, "cut", hashlib.sha256(raw).hexdigest())
    assert "not a TFRecord file" in problem and frames == b""
    _, (problem, _) = check(tmp_path, "cut", "0" * 64)
    assert "sha256 differs" in problem
    _, (problem, _) = check(tmp_path, "missing", "0" * 64)
    assert "cannot be read" in problem


def test_a_gzip_shard_that_does_not_inflate_is_named_by_its_sha256(tmp_path):
    """A byte flipped inside a gzip shard's deflate stream: the check names
    the sha256 that differs (not "cannot be read (error)", zlib's error
    class); a file that matches its sha256 yet is no gzip is not a TFRecord
    file."""
    _, info = write_base_shard(tmp_path, "zipped", records(30), "gzip")
    data = bytearray((tmp_path / "zipped").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "zipped").write_bytes(data)
    _, (problem, frames) = check(tmp_path, "zipped", info.sha256, "gzip")
    assert problem == "zipped: sha256 differs from the base's kiln.json" and frames == b""
    raw = b"".join(tfrecord.frame(r) for r in records(3))
    (tmp_path / "plain").write_bytes(raw)
    _, (problem, _) = check(tmp_path, "plain", hashlib.sha256(raw).hexdigest(), "gzip")
    assert problem.startswith("plain: not a TFRecord file (Error -3")


def reused_slice(path, starts, positions, compression=None):
    entries = tuple(
        (f"{position:016x}", starts[position], starts[position + 1] - starts[position], b"{}")
        for position in positions
    )
    return sharding.ReusedSlice(path, compression, entries)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_reused_frames_are_copied_exactly_across_gaps(tmp_path, monkeypatch, compression):
    # Small read-through limit: the gaps below make separate reads.
    monkeypatch.setattr(sharding, "_READ_THROUGH_BYTES", 200)
    data = records(60, size=40)
    path, info = write_base_shard(tmp_path, "base", data, compression)
    _, (_, frames) = check(tmp_path, "base", info.sha256, None if compression == "none" else "gzip")
    starts = incremental.frame_starts(frames)
    positions = [0, 1, 2, 9, 30, 31, 59]  # neighbours, small and large gaps, the last
    copied = sharding.read_reused(
        [reused_slice(path, starts, positions, None if compression == "none" else "gzip")]
    )
    assert [tfrecord.unframe(framed) for _, framed, _ in copied] == [data[p] for p in positions]
    assert [framed for _, framed, _ in copied] == [tfrecord.frame(data[p]) for p in positions]


def test_reused_frames_of_a_large_gzip_shard_stream_in_bounded_memory(tmp_path):
    """A few records wanted from a 48 MB gzip shard of incompressible
    records: read in one forward inflate, holding the wanted frames and an
    inflate buffer, not the shard (nor its compressed bytes) in memory."""
    rng = random.Random(0)
    data = [rng.randbytes(1 << 20) for _ in range(48)]
    path, _ = write_base_shard(tmp_path, "big", data, "gzip")
    starts = array.array("Q", [0])
    for record in data:
        starts.append(starts[-1] + tfrecord.framed_size(len(record)))
    positions = [0, 1, 24, 47]
    wanted = [reused_slice(path, starts, positions, "gzip")]
    tracemalloc.start()
    try:
        copied = sharding.read_reused(wanted)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [framed for _, framed, _ in copied] == [tfrecord.frame(data[p]) for p in positions]
    shard_bytes = starts[-1]
    # The four frames copied are 4 MB, the inflate buffer a few more; read
    # whole and inflated, the shard would take 96 MB.
    assert peak < shard_bytes / 4, f"peak {peak / 2**20:.1f} MB"


def test_a_gzip_base_shard_that_no_longer_inflates_is_refused(tmp_path):
    data = records(200, size=400)
    path, info = write_base_shard(tmp_path, "base", data, "gzip")
    _, (_, frames) = check(tmp_path, "base", info.sha256, "gzip")
    starts = incremental.frame_starts(frames)
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # inside the deflate stream
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(OSError, match=re.escape(f"{path}: ")):
        sharding.read_reused([reused_slice(path, starts, [0, 199], "gzip")])


def test_a_base_shard_changed_after_its_check_is_refused(tmp_path):
    data = records(10)
    path, info = write_base_shard(tmp_path, "base", data)
    _, (_, frames) = check(tmp_path, "base", info.sha256)
    starts = incremental.frame_starts(frames)
    raw = bytearray(open(path, "rb").read())
    raw[starts[4] + 20] ^= 0xFF  # inside record 4's data
    with open(path, "wb") as f:
        f.write(raw)
    assert sharding.read_reused([reused_slice(path, starts, [3])])  # record 3 is intact
    with pytest.raises(OSError, match="changed after its check"):
        sharding.read_reused([reused_slice(path, starts, [3, 4])])
    os.remove(path)
    with pytest.raises(OSError):
        sharding.read_reused([reused_slice(path, starts, [3])])


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_base_shard_reads_its_records_by_position_in_one_pass(tmp_path, compression):
    """`BaseShard`, which relabelled and moved records are read with: the
    record at each position asked for, ascending (repeats served from the
    last read), from a plain shard or by one inflate of a gzip one; None,
    never an exception, for a position it does not have and, once the file
    is cut short after its check, for every record past the cut."""
    data = records(40, size=300)
    gzip = None if compression == "none" else "gzip"
    path, info = write_base_shard(tmp_path, "base", data, compression)
    _, (_, frames) = check(tmp_path, "base", info.sha256, gzip)
    starts = incremental.frame_starts(frames)
    positions = [0, 3, 3, 4, 17, 39]
    with incremental.BaseShard(path, gzip, starts) as shard:
        assert [shard.record(p) for p in positions] == [data[p] for p in positions]
        assert shard.record(40) is None and shard.record(-1) is None

    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(raw[: len(raw) // 2])
    with incremental.BaseShard(path, gzip, starts) as shard:
        read = [shard.record(p) for p in range(len(data))]
    assert read[0] == data[0] and read[-1] is None
    cut = read.index(None)
    assert read[:cut] == data[:cut] and read[cut:] == [None] * (len(data) - cut)

    with open(path, "wb") as f:
        f.write(b"not a shard at all" * 100)
    with incremental.BaseShard(path, gzip, starts) as shard:
        assert [shard.record(p) for p in positions] == [None] * len(positions)
    os.remove(path)
    with incremental.BaseShard(path, gzip, starts) as shard:
        assert shard.record(3) is None


def test_merging_sorts_as_a_full_build_sorts_records_even_on_equal_sort_keys():
    # What a full build does: sort (sort_key, record, index entry) tuples.
    items = [
        ("00aa", b"zeta", b"1"),
        ("00aa", b"alpha", b"2"),
        ("0001", b"x", b"3"),
        ("00aa", b"alpha", b"0"),
        ("ffff", b"y", b"4"),
        ("00ab", b"a", b"5"),
    ]
    new = [(k, tfrecord.frame(r), e) for k, r, e in items[:3]]
    copied = [(k, tfrecord.frame(r), e) for k, r, e in items[3:]]
    merged = sharding._merge(new, copied)
    assert [(k, tfrecord.unframe(f), e) for k, f, e in merged] == sorted(items)


def _transform_labels(pipeline) -> list[str]:
    import apache_beam as beam

    labels: list[str] = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            labels.append(node.full_label)

        def visit_transform(self, node):
            labels.append(node.full_label)

    pipeline.visit(Visitor())
    return labels


@pytest.mark.parametrize("shards, reshuffled", [(5, False), (40, True)])
def test_a_few_base_files_are_checked_without_a_shuffle_of_their_own(tmp_path, shards, reshuffled):
    # A reshuffle is a stage of its own (a shuffle, a bundle on the local
    # runner): a base of a few shards is hashed where it is listed, a base
    # of many is spread over the workers.
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    names = [f"d-train.tfrecord-{i:05d}-of-{shards:05d}" for i in range(shards)]
    for name in names:
        (tmp_path / name).write_bytes(tfrecord.frame(name.encode()))
    base = incremental.BaseFiles(
        "v",
        str(tmp_path),
        tuple((name, hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()) for name in names),
        None,
    )
    with beam.Pipeline("DirectRunner") as pipeline:
        checks = pipeline | "Verify" >> incremental.VerifyBaseFiles(base)
        problems = checks | beam.Map(lambda kv: (kv[0], kv[1][0]))
        assert_that(problems, equal_to([(name, "") for name in names]))
    shuffles = [
        label
        for label in _transform_labels(pipeline)
        if label.startswith("Verify/") and label.endswith("/GroupByKey")
    ]
    assert bool(shuffles) == reshuffled
