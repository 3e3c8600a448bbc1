"""Incremental builds trust file stamps: a listed file whose key and stamp
(size, modification time and, for a local file, inode and ctime) are those
the base build listed is not read, its sha256 taken from the base's record
index (the listing the base was built from is kept in
``<output>/<name>/.file-stamps/<version>/``). ``--rehash`` reads every
file; a touched file, a base without its listing, or a damaged one is read
and hashed as before. So is a local file whose size and modification time
are as listed but not its inode or ctime: two same-size files swapped by
renames, a file replaced by a copy with its time restored (``cp -p``,
``tar x``, ``touch -r``), a ``chmod`` (read, its record still reused).
Real builds throughout; the proof that a file was not read is the reads of
the image step and of the up-to-date check, noted, and on the in-memory
object store (where a test can set an object's update time) a same-size
object of garbage under the base's stamp (read, it would be dropped as
corrupt)."""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

import object_store
import targets_data
from conftest import backdated, make_config
from kiln.pipeline import build, images, incremental, publish, up_to_date
from kiln.pipeline.command import summary
from test_build_incremental import copy_corpus, good_keys, index_rows, new_png
from test_build_listing_job import BUCKET, ROOT, store  # noqa: F401 (a fixture)

SAME_SIZE = "circle/zz_same_size.png"


def same_size_png(seed: int) -> bytes:
    """A PNG without compression: its size depends on its shape alone, so
    two seeds give two images of the same byte size."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    assert ok
    return data.tobytes()


def rewrite_keeping_stamp(path, data: bytes) -> None:
    """Writes `data` (of the file's size) to `path` and gives it back its
    modification time (``cp -p`` over it, ``touch -r``): a change its size
    and modification time do not show; its ctime does."""
    before = os.stat(path)
    assert len(data) == before.st_size
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def replace_keeping_stamp(path, data: bytes) -> None:
    """Puts a new file with `data` (of the file's size) and the old file's
    modification time in `path`'s place (``tar x``, ``rsync -a``): another
    inode under the same size and modification time."""
    before = os.stat(path)
    assert len(data) == before.st_size
    new = f"{path}.new"
    with open(new, "wb") as f:
        f.write(data)
    os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(new, path)
    assert os.stat(path).st_ino != before.st_ino


def swap_by_renames(first, second) -> None:
    """``mv a t; mv b a; mv t b``."""
    between = f"{first}.swap"
    os.rename(first, between)
    os.rename(second, first)
    os.rename(between, second)


def garbage_of_size(path) -> bytes:
    """Bytes of `path`'s size that no decoder reads as an image."""
    return b"\x00garbage" * (os.path.getsize(path) // 8) + b"!" * (os.path.getsize(path) % 8)


def noted_reads(monkeypatch) -> list[str]:
    """The paths whose bytes the builds that follow read: in the image step
    (the real `images._read`, noted) and in the up-to-date check (the real
    `up_to_date._file_sha256`, noted)."""
    reads: list[str] = []
    read, file_sha256 = images._read, up_to_date._file_sha256

    def noting_read(uri):
        reads.append(uri)
        return read(uri)

    def noting_sha256(uri):
        reads.append(uri)
        return file_sha256(uri)

    monkeypatch.setattr(images, "_read", noting_read)
    monkeypatch.setattr(up_to_date, "_file_sha256", noting_sha256)
    return reads


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def row_of(result, key):
    return next(row for row in index_rows(result) if row.key == key)


def record_of(result, key):
    """A record's index row without its placement (shard, position, line)."""
    return row_of(result, key)._replace(shard="", position=0, line="")


@pytest.fixture
def stamped(demo_corpus, tmp_path):
    """A copy of the demo corpus with `SAME_SIZE` added, built once: the
    images folder, the config and the base build."""
    images_dir = copy_corpus(demo_corpus, tmp_path)
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    backdated(images_dir)
    config = make_config(images_dir, output=str(tmp_path / "out"))
    return images_dir, config, build(config)


def untrustworthy_night(demo_corpus, images_dir) -> tuple[str, str]:
    """`SAME_SIZE` rewritten with other pixels in place and an unchanged key
    of the corpus replaced by a new file of garbage, both of the same size
    and with their modification times restored; and a file added.
    Returns the garbage file's key and the added file's."""
    rewrite_keeping_stamp(images_dir / SAME_SIZE, same_size_png(2))
    unchanged = good_keys(demo_corpus, images_dir)[3]
    replace_keeping_stamp(images_dir / unchanged, garbage_of_size(images_dir / unchanged))
    added = "star/zz_added.png"
    (images_dir / added).write_bytes(new_png(7))
    return unchanged, added


def test_a_file_with_the_base_stamp_is_not_read(demo_corpus, stamped, monkeypatch):
    images_dir, config, base = stamped
    added = "star/zz_added.png"
    (images_dir / added).write_bytes(new_png(7))
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert record_of(incremental, SAME_SIZE) == record_of(base, SAME_SIZE)
    assert incremental.info.dropped == base.info.dropped
    # Read: the added file only. The broken files (dropped, so no base row)
    # are dropped again as the base dropped them (tests/test_build_dropped_again.py).
    read_keys = {os.path.relpath(uri, images_dir) for uri in reads}
    assert read_keys == {added}
    report = incremental.incremental
    assert report.used and report.hashed_all == ""
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    broken = len(demo_corpus.broken)
    assert report.reused == report.not_read == stored_before
    assert (report.added, report.changed, report.dropped_again) == (1, 0, broken)
    # The counters tell a cost watcher the same: the files read (and their
    # bytes) are the added one only.
    counters = incremental.counters
    assert counters["files_not_read"] == stored_before
    assert counters["files_dropped_again"] == broken
    assert counters["files_read"] == len(read_keys)
    assert counters["bytes_read"] == sum(os.path.getsize(images_dir / key) for key in read_keys)
    assert f"not read: {stored_before} files" in summary(incremental)
    stamps = os.path.join(base.dataset_root, publish.FILE_STAMPS_FOLDER)
    assert sorted(os.listdir(stamps)) == sorted([base.version, incremental.version])


def test_rehash_reads_every_file(demo_corpus, stamped, monkeypatch):
    images_dir, config, base = stamped
    garbage, _ = untrustworthy_night(demo_corpus, images_dir)
    reads = noted_reads(monkeypatch)

    rehashed = build(config, rehash=True)

    report = rehashed.incremental
    assert report.used and report.not_read == 0 and report.hashed_all == "--rehash"
    assert row_of(rehashed, SAME_SIZE).sha256 == sha256_of(same_size_png(2))  # its new pixels
    assert garbage not in {row.key for row in index_rows(rehashed)}
    assert sum(rehashed.info.dropped.values()) == sum(base.info.dropped.values()) + 1
    assert len(reads) == len(good_keys(demo_corpus, images_dir)) + len(demo_corpus.broken)
    assert "every file read and hashed: --rehash" in summary(rehashed)


def test_a_file_rewritten_with_its_stamp_restored_is_read_without_rehash(
    demo_corpus, stamped, tmp_path, monkeypatch
):
    """A file rewritten in place with its modification time restored
    (``cp -p`` over it, ``touch -r``: a new ctime) and one replaced by a new
    file so (``tar x``, ``rsync -a``: a new inode) keep their size and
    modification time, not their status-change identity: the inputs' stamp
    differs, and the job reads both (the new pixels stored, the garbage
    dropped), giving a build from scratch's bytes. No other file is read."""
    from test_build_incremental import assert_same_dataset, full_build

    images_dir, config, base = stamped
    garbage, added = untrustworthy_night(demo_corpus, images_dir)
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert not night.up_to_date and night.incremental.hashed_all == ""
    assert row_of(night, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    assert garbage not in {row.key for row in index_rows(night)}
    assert sum(night.info.dropped.values()) == sum(base.info.dropped.values()) + 1
    read_keys = {os.path.relpath(uri, images_dir) for uri in reads}
    assert read_keys == {added, SAME_SIZE, garbage}
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert night.incremental.not_read == stored_before - 2
    assert_same_dataset(night, full_build(config, tmp_path))


def test_two_same_size_files_swapped_by_renames_are_read(demo_corpus, tmp_path, monkeypatch):
    """``mv a t; mv b a; mv t b`` of two same-size images with the same
    modification time: each key keeps its size and time, not its inode.
    The incremental build reads both and gives a full build's bytes."""
    from test_build_incremental import assert_same_dataset, full_build

    images_dir = copy_corpus(demo_corpus, tmp_path)
    other = "circle/zz_same_size_too.png"
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    (images_dir / other).write_bytes(same_size_png(2))
    backdated(images_dir)
    when = os.stat(images_dir / SAME_SIZE).st_mtime_ns
    os.utime(images_dir / other, ns=(when, when))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    swap_by_renames(images_dir / SAME_SIZE, images_dir / other)
    for key in (SAME_SIZE, other):
        assert (os.path.getsize(images_dir / key), os.stat(images_dir / key).st_mtime_ns) == (
            len(same_size_png(1)),
            when,
        )
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert row_of(night, SAME_SIZE).sha256 == row_of(base, other).sha256
    assert row_of(night, other).sha256 == row_of(base, SAME_SIZE).sha256
    read_keys = {os.path.relpath(uri, images_dir) for uri in reads}
    assert read_keys == {SAME_SIZE, other}
    assert night.incremental.changed == 2
    assert_same_dataset(night, full_build(config, tmp_path))


def test_the_inputs_stamp_is_not_up_to_date_after_a_swap(demo_corpus, tmp_path):
    """The swap as the night's only change: the up-to-date check does not
    name the base version (it would have published its records under the
    swapped keys); the build after is up to date on the new version."""
    images_dir = copy_corpus(demo_corpus, tmp_path)
    first, second = SAME_SIZE, "star/zz_same_size.png"  # of two classes
    (images_dir / first).write_bytes(same_size_png(3))
    (images_dir / second).write_bytes(same_size_png(4))
    backdated(images_dir)
    when = os.stat(images_dir / first).st_mtime_ns
    os.utime(images_dir / second, ns=(when, when))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    swap_by_renames(images_dir / first, images_dir / second)

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert row_of(night, first).sha256 == sha256_of(same_size_png(4))
    assert build(config).up_to_date


def test_a_chmod_costs_one_read_not_a_record(demo_corpus, stamped, monkeypatch):
    """A ``chmod`` sets a file's ctime: the stamp differs, the file is read
    and hashed, its sha256 is its record's, and the record is reused: the
    same version, byte for byte."""
    images_dir, config, base = stamped
    chmodded = good_keys(demo_corpus, images_dir)[5]
    os.chmod(images_dir / chmodded, 0o600)
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert not night.up_to_date and night.version == base.version
    read_keys = {os.path.relpath(uri, images_dir) for uri in reads}
    assert read_keys == {chmodded}
    report = night.incremental
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert (report.reused, report.changed, report.added) == (stored_before, 0, 0)
    assert report.not_read == stored_before - 1
    assert night.counters["records_reused"] == stored_before
    assert night.info == base.info  # the shards' sha256s included
    assert record_of(night, chmodded) == record_of(base, chmodded)


@pytest.mark.usefixtures("store")
def test_rehash_finds_a_rewrite_the_inputs_stamp_does_not_show(demo_corpus, monkeypatch):
    """On an object store a stamp is the size and update time: an object
    rewritten with both as listed (which a test can do to the in-memory
    store) is not seen by the inputs' stamp, which a plain build calls up
    to date. ``--rehash`` trusts no stamp, that one included: it runs the
    job, reads every object and drops the garbage; the next plain build is
    up to date on that version, not on the base."""
    config = make_config(ROOT, output=f"{BUCKET}/out")
    config["source"] = dict(config["source"], listing="job")
    base = build(config)
    rewritten = f"{ROOT}/{good_keys(demo_corpus, Path(demo_corpus.out_dir))[3]}"
    data, updated = object_store.OBJECTS[rewritten]
    object_store.OBJECTS[rewritten] = (b"\x00" * len(data), updated)
    assert build(config).up_to_date
    reads = noted_reads(monkeypatch)

    rehashed = build(config, rehash=True)

    assert not rehashed.up_to_date and rehashed.version != base.version
    assert rewritten in reads
    assert sum(rehashed.info.dropped.values()) == sum(base.info.dropped.values()) + 1
    assert rehashed.incremental.hashed_all == "--rehash"
    again = build(config)
    assert again.up_to_date and again.version == rehashed.version


def test_honest_stamps_give_the_bytes_of_a_rehashed_and_a_full_build(demo_corpus, tmp_path):
    """With the stamps telling the truth (a file changed, one added, one
    deleted, the rest untouched), trusting them changes no byte."""
    from test_build_incremental import assert_same_dataset, change_add_delete, full_build

    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    build(config)
    rehash_config = dict(config, output=str(tmp_path / "rehash"))
    shutil.copytree(tmp_path / "out", tmp_path / "rehash")  # the same base, stamps and all
    change_add_delete(demo_corpus, images_dir)

    trusted = build(config)
    rehashed = build(rehash_config, rehash=True)

    assert trusted.incremental.not_read == trusted.incremental.reused > 50
    assert rehashed.incremental.not_read == 0
    assert_same_dataset(trusted, rehashed)
    assert_same_dataset(trusted, full_build(config, tmp_path))


def test_a_touched_file_is_read_and_reused(demo_corpus, stamped, monkeypatch):
    images_dir, config, base = stamped
    touched = good_keys(demo_corpus, images_dir)[8]
    later = os.stat(images_dir / touched).st_mtime + 60
    os.utime(images_dir / touched, (later, later))
    (images_dir / "star/zz_added.png").write_bytes(new_png(7))
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    report = incremental.incremental
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert report.reused == stored_before and report.not_read == stored_before - 1
    assert str(images_dir / touched) in reads
    assert record_of(incremental, touched) == record_of(base, touched)


def test_a_base_without_its_listing_reads_every_file(demo_corpus, stamped, monkeypatch):
    images_dir, config, base = stamped
    shutil.rmtree(os.path.join(base.dataset_root, publish.FILE_STAMPS_FOLDER, base.version))
    garbage, _ = untrustworthy_night(demo_corpus, images_dir)

    incremental = build(config)

    report = incremental.incremental
    assert report.used and report.not_read == 0
    assert "keeps no file stamps" in report.hashed_all
    assert row_of(incremental, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    assert garbage not in {row.key for row in index_rows(incremental)}
    assert "every file read and hashed: base" in summary(incremental)
    # This build keeps its own listing: the next one trusts it.
    kept = os.listdir(os.path.join(base.dataset_root, publish.FILE_STAMPS_FOLDER))
    assert kept == [incremental.version]


def test_a_file_modified_as_its_base_build_started_is_read(demo_corpus, tmp_path, monkeypatch):
    """A stamp at or after the start of the build that listed it (here one
    a minute ahead, standing for a file modified as the base build ran,
    within the clock's tick) is not trusted: the file may have been
    rewritten after that build read it, its size and modification time as
    listed. It is read, and its new pixels stored."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    ahead = os.stat(images_dir / SAME_SIZE).st_mtime + 60
    os.utime(images_dir / SAME_SIZE, (ahead, ahead))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    rewrite_keeping_stamp(images_dir / SAME_SIZE, same_size_png(2))
    (images_dir / "star/zz_added.png").write_bytes(new_png(7))
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert row_of(incremental, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    assert str(images_dir / SAME_SIZE) in reads
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert incremental.incremental.not_read == stored_before - 1
    assert incremental.counters["base_stamps_too_recent"] == 1


def build_started(result) -> float:
    """When the build that made `result`'s version started, as kept with its
    file stamps (`publish.LISTED_FROM_FILE`)."""
    folder = os.path.join(result.dataset_root, publish.FILE_STAMPS_FOLDER, result.version)
    with open(os.path.join(folder, publish.LISTED_FROM_FILE)) as f:
        return float(f.read())


def test_a_build_right_after_files_were_written_reads_them_to_be_up_to_date(
    demo_corpus, tmp_path, monkeypatch, caplog
):
    """Files written just before a build are racily clean to the next one
    (their stamps could hide a rewrite in the same clock tick): it reads
    exactly those, finds them as the version's records, and is up to date.
    The first build did not wait for them to age: it started (and
    recorded its start) within `RACY_SECONDS` of their modification. Once
    every file is older than a build's start, the check reads nothing."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    fresh = sorted([SAME_SIZE, "star/zz_added.png"])
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    (images_dir / "star/zz_added.png").write_bytes(new_png(7))
    newest = max(os.stat(images_dir / key).st_mtime for key in fresh)
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    assert build_started(base) - incremental.RACY_SECONDS <= newest  # no wait
    reads = noted_reads(monkeypatch)
    caplog.set_level("INFO", logger="kiln.pipeline.up_to_date")

    again = build(config)

    assert again.up_to_date and again.version == base.version
    assert sorted(os.path.relpath(uri, images_dir) for uri in reads) == fresh
    assert f"read the 2 files modified within 2 s of the start of version {base.version}'s" in (
        caplog.text
    )
    backdated(images_dir)  # new stamps: the job runs, and reads every file
    rebuilt = build(config)
    assert not rebuilt.up_to_date and rebuilt.version == base.version
    reads.clear()
    assert build(config).up_to_date and reads == []


def test_a_build_that_verified_recent_files_does_not_read_them_again(
    demo_corpus, tmp_path, monkeypatch
):
    """A build that found racily clean files equal to their records keeps
    the time it started reading them as the version's build start: the
    files are older than it less `RACY_SECONDS`, so the next build is up to
    date without reading them again. Rewritten after that, the file is
    found by its new stamp, as any other."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    written = os.stat(images_dir / SAME_SIZE).st_mtime
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    started = build_started(base)
    assert started - incremental.RACY_SECONDS <= written  # racily clean to the next build
    time.sleep(max(0.0, written + incremental.RACY_SECONDS + 0.05 - time.time()))
    reads = noted_reads(monkeypatch)
    verifying = time.time()
    again = build(config)
    assert again.up_to_date and [os.path.relpath(uri, images_dir) for uri in reads] == [SAME_SIZE]
    assert started < verifying <= build_started(base) <= time.time()
    reads.clear()

    assert build(config).up_to_date and reads == []
    (images_dir / SAME_SIZE).write_bytes(same_size_png(2))
    night = build(config)
    assert not night.up_to_date
    assert row_of(night, SAME_SIZE).sha256 == sha256_of(same_size_png(2))


def test_a_file_rewritten_unseen_after_a_build_just_after_it_was_written_is_found(
    demo_corpus, tmp_path, monkeypatch
):
    """A file written just before a build and rewritten after the job read
    it, with its size and modification time as listed (here restored; its
    ctime is not: the inputs' stamp differs, as it would not for an object
    rewritten in the same clock tick, whose racy check the listing job's
    tests show): the next build reads the file and runs the job, which
    stores its bytes. The build after it verifies the file again, against
    the new version: up to date."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    rewrite_keeping_stamp(images_dir / SAME_SIZE, same_size_png(2))
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert row_of(night, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    assert {os.path.relpath(uri, images_dir) for uri in reads} == {SAME_SIZE}
    again = build(config)
    assert again.up_to_date and again.version == night.version


@pytest.mark.parametrize("rewritten", [False, True])
def test_a_recently_written_file_the_build_dropped_is_verified_by_its_kept_sha256(
    demo_corpus, tmp_path, monkeypatch, caplog, rewritten
):
    """A file modified as the version's build started that the build
    dropped (here a broken file) has no record: it is compared with the
    sha256 the job kept for the files it dropped, beside the version
    (not in errors.jsonl). The same bytes: up to date, the file read and
    nothing else. Rewritten with its size and modification time restored,
    its ctime is not as listed: the inputs' stamp differs, and the job runs
    and drops those bytes (the stamp found it: nothing was compared; for a
    rewrite the stamp cannot see, see the object store's test below)."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    broken = sorted(demo_corpus.broken)[-1]
    (images_dir / broken).write_bytes((images_dir / broken).read_bytes())
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    kept = Path(base.dataset_root, publish.FILE_STAMPS_FOLDER, base.version)
    assert broken in (kept / publish.DROPPED_SHA256S_FILE).read_text()
    if rewritten:
        other = b"\x00" + (images_dir / broken).read_bytes()[1:]
        assert other != (images_dir / broken).read_bytes()
        rewrite_keeping_stamp(images_dir / broken, other)
    reads = noted_reads(monkeypatch)
    caplog.set_level("INFO", logger="kiln.pipeline.up_to_date")

    night = build(config)

    if rewritten:  # other bytes dropped: a version names them (its entries' sha256)
        assert not night.up_to_date and night.version != base.version
        assert "its bytes differ" not in caplog.text
    else:
        assert night.up_to_date and night.version == base.version
        assert [os.path.relpath(uri, images_dir) for uri in reads] == [broken]


@pytest.mark.usefixtures("store")
def test_a_recently_updated_dropped_object_rewritten_unseen_is_found_by_its_kept_sha256(
    demo_corpus, caplog
):
    """On an object store a rewrite can keep the stamp (size and update time
    as listed) when the object was updated as the base build started: the
    up-to-date check compares the dropped object with the sha256 the job
    kept for it, finds other bytes and runs the job."""
    config = make_config(ROOT, output=f"{BUCKET}/out")
    config["source"] = dict(config["source"], listing="job")
    broken = f"{ROOT}/{sorted(demo_corpus.broken)[-1]}"
    data, _ = object_store.OBJECTS[broken]
    ahead = time.time() + 60  # updated as the build ran
    object_store.OBJECTS[broken] = (data, ahead)
    base = build(config)
    object_store.OBJECTS[broken] = (b"\x00" + data[1:], ahead)
    caplog.set_level("INFO", logger="kiln.pipeline.up_to_date")

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert f"{sorted(demo_corpus.broken)[-1]}: its bytes differ from its record's" in caplog.text


def test_a_recently_written_dropped_file_without_its_kept_sha256_is_not_verified(
    demo_corpus, tmp_path, caplog
):
    """A version kept without the sha256 of the files it dropped (built by
    a kiln before it kept them, or the file deleted): a dropped file
    modified as its build started cannot be compared, and the next build
    runs the job (publishing the same version again)."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    broken = sorted(demo_corpus.broken)[0]
    (images_dir / broken).write_bytes((images_dir / broken).read_bytes())
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    kept = Path(base.dataset_root, publish.FILE_STAMPS_FOLDER, base.version)
    (kept / publish.DROPPED_SHA256S_FILE).unlink()
    caplog.set_level("INFO", logger="kiln.pipeline.up_to_date")

    night = build(config)

    assert not night.up_to_date and night.version == base.version
    assert f"{broken}: modified as that version's build started, and it has no record" in (
        caplog.text
    )
    assert (kept / publish.DROPPED_SHA256S_FILE).exists()  # kept again by the new build
    assert build(config).up_to_date


@pytest.mark.parametrize("start", ["damaged", "missing"])
def test_a_version_without_its_build_start_time(demo_corpus, tmp_path, monkeypatch, start):
    """Its racily clean files are unknown. A start time that cannot be read
    makes the next build run the job, which keeps its own; without one (a
    version built by a kiln that kept none, or its ``.file-stamps`` folder
    deleted) the inputs' stamp is trusted as it was then: the file written
    just before the build is not read to verify it."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    assert (
        build_started(base) - incremental.RACY_SECONDS <= os.stat(images_dir / SAME_SIZE).st_mtime
    )
    folder = os.path.join(base.dataset_root, publish.FILE_STAMPS_FOLDER, base.version)
    if start == "damaged":
        with open(os.path.join(folder, publish.LISTED_FROM_FILE), "w") as f:
            f.write("half a ti")
    else:
        shutil.rmtree(folder)
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert night.version == base.version
    if start == "damaged":
        assert not night.up_to_date
    else:
        assert night.up_to_date and reads == []


def test_a_file_modified_as_its_base_build_started_is_read_though_nothing_else_changed(
    demo_corpus, tmp_path, monkeypatch
):
    """The same, when that rewrite is the night's only change: the dataset
    is not up to date (the rewrite's ctime changes the inputs' stamp; had
    it not, the up-to-date check would read the file, dated after the base
    build started). The next build runs the job, reads the file and stores
    its new pixels."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    (images_dir / SAME_SIZE).write_bytes(same_size_png(1))
    ahead = os.stat(images_dir / SAME_SIZE).st_mtime + 60
    os.utime(images_dir / SAME_SIZE, (ahead, ahead))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    rewrite_keeping_stamp(images_dir / SAME_SIZE, same_size_png(2))
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert row_of(night, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    read_keys = {os.path.relpath(uri, images_dir) for uri in reads}
    assert read_keys == {SAME_SIZE}


def test_a_mask_file_modified_as_its_base_build_started_is_read_though_nothing_else_changed(
    tmp_path,
):
    """Mask files are in the inputs' stamp too: one dated after the base
    build started and rewritten with its size and time restored (its ctime
    is not: the stamp differs) makes the next build run the job, which
    reads it (its stamp too recent to trust, and not the base's) and
    stores it."""
    from test_targets_build import config as targets_config
    from test_targets_incremental import png, read_rows

    folder = tmp_path / "data"
    folder.mkdir()
    targets_data.corpus(folder, 4)
    backdated(folder)
    mask_path = folder / read_rows(folder)[1]["mask"]
    ahead = os.stat(mask_path).st_mtime + 3600 + 60
    os.utime(mask_path, (ahead, ahead))
    config = targets_config(str(folder / "manifest.jsonl"), tmp_path / "out")
    base = build(config)
    mask = cv2.imread(str(mask_path), cv2.IMREAD_UNCHANGED)
    mask[0, :] = 1 - mask[0, :].clip(0, 1)
    rewrite_keeping_stamp(mask_path, png(mask))  # the same size: checked there

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert night.incremental.changed == 1


def test_a_trusted_image_whose_annotations_or_mask_changed_gets_them(tmp_path, monkeypatch):
    """With targets, an image file's stamp vouches for its bytes only: a
    box edited in the manifest, or a mask file edited, beside an image file
    that is not read, gives the record of a build from scratch."""
    from test_targets_build import config as targets_config
    from test_targets_build import digests
    from test_targets_incremental import png, read_rows, write_rows

    folder = tmp_path / "data"
    folder.mkdir()
    targets_data.corpus(folder, 6)
    backdated(folder)
    config = targets_config(str(folder / "manifest.jsonl"), tmp_path / "out")
    build(config)
    rows = read_rows(folder)
    box = rows[2]["objects"][1]["bbox"]
    rows[2]["objects"][1]["bbox"] = [box[0] + 1, box[1], box[2] + 1, box[3]]
    write_rows(folder, rows)
    mask = cv2.imread(str(folder / rows[3]["mask"]), cv2.IMREAD_UNCHANGED)
    mask[0, :] = 1
    (folder / rows[3]["mask"]).write_bytes(png(mask))
    reads = noted_reads(monkeypatch)

    night = build(config)

    assert night.incremental.changed == 2 and night.incremental.not_read == 4
    assert sorted(os.path.relpath(uri, folder) for uri in reads) == [
        rows[2]["path"],
        rows[3]["path"],
    ]
    full = build(dict(config, output=str(tmp_path / "full")))
    assert night.version == full.version and digests(night) == digests(full)


def without_inode_ctime(result) -> None:
    """Rewrites the listing kept beside `result`'s version as a kiln that
    listed no inode and ctime wrote it: without ``inode_ctime``, and mask
    stamps of ``[size, mtime]``."""
    folder = Path(result.dataset_root, publish.FILE_STAMPS_FOLDER, result.version)
    for path in folder.iterdir():
        if path.name.startswith("."):
            continue
        lines = []
        for line in path.read_text().splitlines():
            row = json.loads(line)
            for file in row.get("files", ()):
                file.pop("inode_ctime", None)
                if "mask_stamp" in file:
                    file["mask_stamp"] = [stamp[:2] for stamp in file["mask_stamp"]]
            lines.append(json.dumps(row, sort_keys=True) + "\n")
        path.write_text("".join(lines))


def test_a_base_listed_without_inode_and_ctime_has_its_files_read_once(
    demo_corpus, stamped, monkeypatch
):
    """A base kept by a kiln before the stamps held inode and ctime: its
    local files' stamps are not trusted, so each is read once (its record
    reused, not decoded); the build keeps its own listing, and the next
    build reads none of them."""
    images_dir, config, base = stamped
    without_inode_ctime(base)
    (images_dir / "star/zz_added.png").write_bytes(new_png(7))  # the job runs
    earlier = time.time() - 3600  # not racily clean to the build after
    os.utime(images_dir / "star/zz_added.png", (earlier, earlier))
    reads = noted_reads(monkeypatch)

    night = build(config)

    report = night.incremental
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert report.used and report.hashed_all == ""
    assert (report.reused, report.changed, report.added) == (stored_before, 0, 1)
    assert report.not_read == 0
    assert len(reads) == stored_before + 1 + len(demo_corpus.broken)
    reads.clear()
    (images_dir / "star/zz_added_too.png").write_bytes(new_png(8))

    again = build(config)

    assert again.incremental.not_read == stored_before + 1
    read_keys = {os.path.relpath(uri, images_dir) for uri in reads}
    assert read_keys == {"star/zz_added_too.png"}


@pytest.mark.parametrize("damage", ["garbage", "folder", "no start time"])
def test_a_damaged_listing_of_the_base_reads_its_files(demo_corpus, stamped, damage):
    """Lines that are not listing lines, a listing that cannot be read (here
    a folder where its file was), or no record of when the base's build
    started: its files are read and hashed, the build does not fail."""
    images_dir, config, base = stamped
    folder = os.path.join(base.dataset_root, publish.FILE_STAMPS_FOLDER, base.version)
    (name,) = [name for name in os.listdir(folder) if not name.startswith(".")]
    if damage == "no start time":
        os.remove(os.path.join(folder, publish.LISTED_FROM_FILE))
    else:
        os.remove(os.path.join(folder, name))
    if damage == "garbage":
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b'{"files": [{"key": 3}]}\n\xff\xfe not json\n[1, 2]\n')
    elif damage == "folder":
        os.makedirs(os.path.join(folder, name, "inside"))
    untrustworthy_night(demo_corpus, images_dir)

    incremental = build(config)

    assert incremental.incremental.not_read == 0
    assert row_of(incremental, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    if damage == "garbage":
        assert incremental.counters["base_stamps_bad_lines"] == 3
    elif damage == "folder":
        assert incremental.counters["base_stamps_unreadable"] == 1
    else:
        assert "keeps no file stamps" in incremental.incremental.hashed_all


def test_file_stamps_go_with_their_version(demo_corpus, tmp_path):
    """Pruned with their version (``--keep``), deleted with a version found
    incomplete, never kept for a build that failed."""
    images_dir = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images_dir, output=str(tmp_path / "out"))
    first = build(config)
    stamps = os.path.join(first.dataset_root, publish.FILE_STAMPS_FOLDER)
    (images_dir / "star/zz_added.png").write_bytes(new_png(7))
    second = build(config)
    assert sorted(os.listdir(stamps)) == sorted([first.version, second.version])

    (images_dir / "star/zz_added_too.png").write_bytes(new_png(8))
    third = build(config, keep=1)
    assert third.pruned == (second.version, first.version)
    assert os.listdir(stamps) == [third.version]

    # A version folder without kiln.json (an interrupted prune) loses its stamps too.
    (images_dir / "star/zz_added_3.png").write_bytes(new_png(9))
    fourth = build(config)
    os.remove(os.path.join(third.dataset_dir, "kiln.json"))
    (images_dir / "star/zz_added_4.png").write_bytes(new_png(10))
    fifth = build(config)
    assert sorted(os.listdir(stamps)) == sorted([fourth.version, fifth.version])

    # A build that fails keeps none.
    for key in good_keys(demo_corpus, images_dir):
        (images_dir / key).write_bytes(b"not an image")
    with pytest.raises(Exception, match="dropped"):
        build(config)
    assert sorted(os.listdir(stamps)) == sorted([fourth.version, fifth.version])


@pytest.mark.usefixtures("store")
def test_a_listing_job_trusts_the_stamps_too(demo_corpus, monkeypatch):
    """``source.listing: job``: the listing job's files are kept with the
    version, and an object whose update time and size are the base's is
    not read."""
    config = make_config(ROOT, output=f"{BUCKET}/out")
    config["source"] = dict(config["source"], listing="job")
    base = build(config)
    unchanged = f"{ROOT}/{good_keys(demo_corpus, Path(demo_corpus.out_dir))[3]}"
    data, updated = object_store.OBJECTS[unchanged]
    object_store.OBJECTS[unchanged] = (b"\x00" * len(data), updated)  # garbage, same stamp
    object_store.put(f"{ROOT}/star/zz_added.png", new_png(7))
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert unchanged not in reads
    assert f"{ROOT}/star/zz_added.png" in reads
    assert incremental.info.dropped == base.info.dropped  # the garbage was not read
    report = incremental.incremental
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert report.reused == report.not_read == stored_before
    folder = f"{base.dataset_root}/{publish.FILE_STAMPS_FOLDER}/"
    kept = {name[len(folder) :].split("/")[0] for name in object_store.names(folder)}
    assert kept == {base.version, incremental.version}


@pytest.mark.usefixtures("store")
def test_a_listing_job_keeps_a_dataset_whose_newest_object_is_too_recent_from_being_up_to_date(
    demo_corpus,
):
    """``source.listing: job``: the listing job finds the newest update time
    too, and the up-to-date check reads its files for the recent objects.
    An object dated after the base build started and rewritten unseen (its
    size and update time as listed) is read by the next build."""
    config = make_config(ROOT, output=f"{BUCKET}/out")
    config["source"] = dict(config["source"], listing="job")
    changed = f"{ROOT}/{good_keys(demo_corpus, Path(demo_corpus.out_dir))[3]}"
    data, _ = object_store.OBJECTS[changed]
    ahead = time.time() + 60  # updated as the build ran
    object_store.OBJECTS[changed] = (data, ahead)
    base = build(config)
    object_store.OBJECTS[changed] = (b"\x00" * len(data), ahead)

    night = build(config)

    assert not night.up_to_date
    assert sum(night.info.dropped.values()) == sum(base.info.dropped.values()) + 1
