"""Incremental builds: a rebuild reuses the unchanged records of LATEST (or
``--base``) without decoding them, and gives the bytes of a from-scratch
build of the same inputs and config (kiln.json included), whatever the
runner mode; a base that cannot be trusted is not used, and the summary
says why."""

import hashlib
import json
import os
import shutil
import sys
import textwrap
import threading

import cv2
import numpy as np
import pytest

from conftest import make_config
from kiln.errors import UsageError
from kiln.pipeline import BuildError, build, publish, record_index, sharding
from kiln.pipeline import incremental as incremental_module
from kiln.pipeline.command import summary
from kiln.pipeline.statistics import PixelSums, TargetCounts, channel_statistics, merge
from kiln.schemas import INDEX_FILENAME
from test_build_determinism import digests

CALLS_MODULE = "kiln_test_incremental_calls"
CALLS_SOURCE = """
    import os
    import numpy as np
    from kiln.transforms import register

    @register()
    def note_each_call(image: np.ndarray) -> np.ndarray:
        # One line per image the chain runs on: proof of which were decoded.
        with open(os.environ["KILN_TEST_CALLS"], "a") as f:
            f.write("x\\n")
        return image
"""


@pytest.fixture(scope="module")
def calls_plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("incremental-plugin")
    (folder / f"{CALLS_MODULE}.py").write_text(textwrap.dedent(CALLS_SOURCE))
    sys.path.insert(0, str(folder))
    yield CALLS_MODULE
    sys.path.remove(str(folder))


def copy_corpus(corpus, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(corpus.out_dir, images)
    return images


def good_keys(corpus, images):
    return sorted(
        f"{c}/{n}"
        for c in os.listdir(images)
        for n in os.listdir(images / c)
        if f"{c}/{n}" not in corpus.broken
    )


def new_png(seed):
    rng = np.random.default_rng(seed)
    ok, data = cv2.imencode(".png", rng.integers(0, 256, (48, 56, 3), dtype=np.uint8))
    assert ok
    return data.tobytes()


def spilled_keys(monkeypatch) -> list[str]:
    """The keys of the records that go through a sorted run (decoded, or
    rewritten in the image step) in the builds that follow, in order: the
    real `RunWriter.add`, noted."""
    spilled: list[str] = []
    add = sharding.RunWriter.add

    def counting_add(self, window, split, key, record, *rest):
        spilled.append(key)
        return add(self, window, split, key, record, *rest)

    monkeypatch.setattr(sharding.RunWriter, "add", counting_add)
    return spilled


def damage_records_after_their_check(monkeypatch) -> None:
    """In the builds that follow, every base shard passes its check and then
    has one byte of each record's data flipped (the base's index is left
    alone): a shard that changed after its check."""
    check = incremental_module._check_file

    def check_then_damage(name_and_sha256, folder, compression):
        result = check(name_and_sha256, folder, compression)
        name = name_and_sha256[0]
        if name != INDEX_FILENAME:
            _, (_, frames) = result
            path = os.path.join(folder, name)
            data = bytearray(open(path, "rb").read())
            for start in incremental_module.frame_starts(frames)[:-1]:
                data[start + 12] ^= 0xFF
            with open(path, "wb") as f:
                f.write(data)
        return result

    monkeypatch.setattr(incremental_module, "_check_file", check_then_damage)


def change_add_delete(corpus, images):
    """One file changed, one added, one deleted; returns their keys."""
    keys = good_keys(corpus, images)
    changed, deleted = keys[5], keys[17]
    (images / changed).write_bytes(new_png(1))
    added = "star/zz_added.png"
    (images / added).write_bytes(new_png(2))
    os.remove(images / deleted)
    return changed, added, deleted


def full_build(config, tmp_path, name="full"):
    """The same inputs and config built from scratch into another output root."""
    return build(dict(config, output=str(tmp_path / name)))


def assert_same_dataset(incremental, full):
    assert incremental.version == full.version
    assert digests(incremental) == digests(full)  # every file, kiln.json included
    assert incremental.info == full.info


def index_rows(result):
    with open(os.path.join(result.dataset_dir, INDEX_FILENAME)) as f:
        return [record_index.parse_line(line) for line in f]


def test_changes_additions_and_deletions_give_a_full_builds_bytes(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    changed, added, deleted = change_add_delete(demo_corpus, images)

    incremental = build(config)

    assert incremental.version != base.version
    report = incremental.incremental
    assert report.used and report.base == base.version and report.reason == ""
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert report.reused == stored_before - 2  # all but the changed and the deleted
    # Processed: the changed and the added file. The three broken files
    # (dropped, so the base has no record of them) are dropped again unread.
    assert (report.added, report.changed, report.deleted) == (1, 1, 1)
    assert report.processed == 2 and report.dropped_again == 3
    assert incremental.counters["images_decoded"] == 2
    assert f"reused {report.reused}, processed 2 (1 new, 1 changed, 0 dropped), 1 gone" in summary(
        incremental
    )
    keys = {row.key for row in index_rows(incremental)}
    assert added in keys and changed in keys and deleted not in keys

    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_two_worker_processes_and_gzip_shards_give_the_same_bytes(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(
        images,
        output=str(tmp_path / "out"),
        sharding={"num_shards": {"train": 3, "validation": 2, "test": 1}, "compression": "gzip"},
    )
    build(config)
    change_add_delete(demo_corpus, images)

    incremental = build(
        config, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    )

    assert incremental.incremental.used and incremental.incremental.reused > 50
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_a_resharded_gzip_build_copies_from_each_base_shard_once_per_new_shard(
    demo_corpus, tmp_path
):
    """More shards than the base: each new shard copies records from two
    base shards, each base shard feeds two new shards. Each gzip base
    shard is inflated once per new shard that copies from it (streamed,
    `sharding.read_reused`), never more, and the output is a full build's."""
    images = copy_corpus(demo_corpus, tmp_path)
    gzip = {"compression": "gzip"}
    config = make_config(
        images,
        output=str(tmp_path / "out"),
        sharding={"num_shards": {"train": 3, "validation": 2, "test": 1}, **gzip},
    )
    base = build(config)
    change_add_delete(demo_corpus, images)
    resharded = dict(
        config, sharding={"num_shards": {"train": 5, "validation": 3, "test": 1}, **gzip}
    )

    incremental = build(resharded)

    base_rows = {row.key: row for row in index_rows(base)}
    pairs = {
        (base_rows[row.key].shard, row.shard)
        for row in index_rows(incremental)
        if row.key in base_rows and base_rows[row.key].sha256 == row.sha256
    }
    assert len({new for _, new in pairs}) == 5 + 3 + 1
    assert len(pairs) > len({old for old, _ in pairs}) == 3 + 2 + 1  # several passes, bounded
    assert incremental.counters["base_shard_inflations"] == len(pairs)
    assert incremental.incremental.reused == incremental.counters["records_copied"] > 50
    assert_same_dataset(incremental, full_build(resharded, tmp_path))


def test_reused_records_are_not_decoded(demo_corpus, tmp_path, calls_plugin, monkeypatch):
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("KILN_TEST_CALLS", str(calls))
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(
        images,
        output=str(tmp_path / "out"),
        plugins=[calls_plugin],
        transforms=[{"resize": {"shorter_side": 40}}, "note_each_call"],
    )
    base = build(config)
    stored = sum(s.num_examples for s in base.info.splits.values())
    assert len(calls.read_text().splitlines()) == stored

    calls.unlink()
    change_add_delete(demo_corpus, images)
    incremental = build(config)

    # The chain ran on the changed and the added image only.
    assert len(calls.read_text().splitlines()) == 2
    assert incremental.incremental.reused == stored - 2


def test_reused_records_are_copied_from_the_base_shards_not_spilled_to_runs(
    demo_corpus, tmp_path, monkeypatch
):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    change_add_delete(demo_corpus, images)
    spilled = spilled_keys(monkeypatch)

    incremental = build(config)

    # Only the decoded images went through run files; the rest were copied
    # from the base's shards by the shard writer.
    assert len(spilled) == incremental.counters["images_decoded"] == 2
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert incremental.counters["records_copied"] == stored_before - 2
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_a_base_shard_changed_after_its_check_fails_the_build(demo_corpus, tmp_path, monkeypatch):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    change_add_delete(demo_corpus, images)
    damage_records_after_their_check(monkeypatch)

    with pytest.raises(BuildError, match="changed after its check"):
        build(config)
    assert publish.DatasetRoot(str(tmp_path / "out" / "shapes")).latest() == base.version


def test_the_base_files_are_hashed_on_the_image_threads_at_once(demo_corpus, tmp_path, monkeypatch):
    # Hashing a base is a cost per byte of the dataset, not of what changed:
    # a worker hashes its files on its image threads at once. Each check
    # waits here for a second one to start: hashed one after another, the
    # first would wait in vain and the build fail.
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(
        images,
        output=str(tmp_path / "out"),
        sharding={"num_shards": {"train": 3, "validation": 2, "test": 1}},
    )
    build(config)
    change_add_delete(demo_corpus, images)
    check = incremental_module._check_file
    together = threading.Barrier(2, timeout=20)
    threads = []

    def check_with_another(name_and_sha256, folder, compression):
        threads.append(threading.current_thread().name)
        if len(threads) <= 2:  # the first two files: both must be under way at once
            together.wait()
        return check(name_and_sha256, folder, compression)

    monkeypatch.setattr(incremental_module, "_check_file", check_with_another)
    incremental = build(config, image_threads=2)
    monkeypatch.undo()

    report = incremental.incremental
    assert report.used and report.reason == ""  # 6 shards and the index: every one trusted
    assert len(threads) == 7 and len(set(threads)) == 2 and not together.broken
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_statistics_and_counts_equal_a_full_build(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    build(config)
    change_add_delete(demo_corpus, images)
    incremental = build(config)
    full = full_build(config, tmp_path)

    for name, split in incremental.info.splits.items():
        assert split.statistics == full.info.splits[name].statistics
        assert split.class_counts == full.info.splits[name].class_counts
        # The index holds the exact sums the statistics are made of.
        sums = PixelSums(0, (), ())
        for row in index_rows(incremental):
            if row.split == name:
                sums = merge(sums, PixelSums(row.pixels, row.sums, row.squares))
        assert channel_statistics(sums) == split.statistics
    assert incremental.info.duplicates == full.info.duplicates
    rows = index_rows(incremental)
    assert len(rows) == sum(s.num_examples for s in incremental.info.splits.values())
    for split in incremental.info.splits.values():
        for shard in split.shards:
            positions = [r.position for r in rows if r.shard == shard.filename]
            assert positions == list(range(shard.num_records))


def test_a_corrupt_base_shard_is_not_trusted_and_its_records_are_processed(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    damaged = base.info.splits["train"].shards[1]
    path = os.path.join(base.dataset_dir, damaged.filename)
    os.chmod(path, 0o644)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # a flipped byte inside a record
    with open(path, "wb") as f:
        f.write(data)
    change_add_delete(demo_corpus, images)

    incremental = build(config)

    report = incremental.incremental
    assert report.used
    assert damaged.filename in report.reason and "sha256" in report.reason
    assert damaged.filename in summary(incremental)
    assert incremental.counters["records_not_trusted"] >= damaged.num_records - 2
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert report.reused <= stored_before - damaged.num_records
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_records_of_a_deleted_base_shard_are_reprocessed_not_new(demo_corpus, tmp_path):
    """A base shard deleted (by hand, a lost object): its records are
    processed from their files again, and counted as `reprocessed`, apart
    from the files the base did not have (`added`): they were counted as new."""
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    deleted = base.info.splits["train"].shards[1]
    os.remove(os.path.join(base.dataset_dir, deleted.filename))
    (images / "star" / "zz_added.png").write_bytes(new_png(2))

    incremental = build(config)

    report = incremental.incremental
    assert report.used and deleted.filename in report.reason
    assert report.added == 1, report  # it was 1 + the deleted shard's records
    assert (report.changed, report.reprocessed) == (0, deleted.num_records)
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    assert report.reused == stored_before - deleted.num_records
    assert incremental.counters["images_decoded"] == deleted.num_records + 1
    # The broken files are dropped again unread, not processed.
    assert report.dropped_again == sum(incremental.info.dropped.values())
    assert report.processed == deleted.num_records + 1
    assert (
        f"processed {report.processed} (1 new, 0 changed, {deleted.num_records} reprocessed, "
        "0 dropped)"
    ) in summary(incremental)
    assert report.to_json()["reprocessed"] == deleted.num_records


def test_a_damaged_index_means_nothing_is_reused(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    path = os.path.join(base.dataset_dir, INDEX_FILENAME)
    os.chmod(path, 0o644)
    with open(path, "a") as f:
        f.write("{}\n")
    change_add_delete(demo_corpus, images)

    incremental = build(config)

    assert incremental.incremental.reused == 0
    assert INDEX_FILENAME in incremental.incremental.reason
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_full_reuses_nothing(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    build(config)
    change_add_delete(demo_corpus, images)

    result = build(config, full=True)

    assert not result.incremental.used and "--full" in result.incremental.reason
    assert result.counters.get("records_reused", 0) == 0
    assert result.counters["images_decoded"] == sum(
        s.num_examples for s in result.info.splits.values()
    )
    assert "full build" in summary(result)


def test_a_different_processing_config_reuses_nothing(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    config["transforms"] = [{"resize": {"shorter_side": 36}}, {"center_crop": {"size": 32}}]

    result = build(config)

    assert not result.incremental.used and result.incremental.base == base.version
    assert "processing differs" in result.incremental.reason
    assert result.counters.get("records_reused", 0) == 0
    assert base.info.processing["fingerprint"] != result.info.processing["fingerprint"]


def test_another_processing_version_is_another_version_name(demo_corpus, tmp_path, monkeypatch):
    # A kiln whose kernels write other bytes bumps PROCESSING_VERSION: the
    # same inputs and config must then not be "up to date" with, nor named
    # like, the version the old kernels wrote.
    from kiln.pipeline import incremental

    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    before = build(config)
    monkeypatch.setattr(incremental, "PROCESSING_VERSION", incremental.PROCESSING_VERSION + 1)

    after = build(config)

    assert not after.up_to_date
    assert after.version != before.version
    assert after.info.config_fingerprint == before.info.config_fingerprint
    assert "processing version" in after.incremental.reason
    assert after.counters.get("records_reused", 0) == 0
    # (These kernels did not change: the shards are the same bytes.)
    shards = [n for n in digests(before) if ".tfrecord-" in n]
    assert {n: digests(after)[n] for n in shards} == {n: digests(before)[n] for n in shards}


def test_a_new_split_salt_reuses_every_record_in_its_new_split(demo_corpus, tmp_path):
    # Splits are not part of the processing: records move, bytes stay.
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    config["splits"] = dict(config["splits"], salt="another draw")

    result = build(config)

    stored = sum(s.num_examples for s in base.info.splits.values())
    assert result.incremental.reused == stored
    assert result.counters.get("images_decoded", 0) == 0
    assert_same_dataset(result, full_build(config, tmp_path))


def test_base_names_an_older_version(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    first = build(config)
    changed, _, _ = change_add_delete(demo_corpus, images)
    build(config)  # LATEST moves on
    (images / changed).write_bytes(new_png(3))

    result = build(config, base=first.version)

    assert result.incremental.base == first.version
    assert_same_dataset(result, full_build(config, tmp_path))


def test_processing_fingerprint_ignores_where_the_files_are(demo_corpus, tmp_path):
    from kiln.pipeline import config as config_module
    from kiln.pipeline import incremental

    here = config_module.load(make_config(demo_corpus.out_dir, output=str(tmp_path)))
    moved = shutil.copytree(demo_corpus.out_dir, tmp_path / "moved")
    there = config_module.load(make_config(moved, output=str(tmp_path / "elsewhere")))
    # Neither fingerprint depends on where the files are (the location is provenance).
    assert here.fingerprint == there.fingerprint
    assert incremental.processing_fingerprint(here.to_json()) == (
        incremental.processing_fingerprint(there.to_json())
    )
    other = config_module.load(
        make_config(demo_corpus.out_dir, output=str(tmp_path), encoding={"format": "jpeg"})
    )
    assert incremental.processing_fingerprint(other.to_json()) != (
        incremental.processing_fingerprint(here.to_json())
    )


def test_processing_fingerprint_follows_the_schemas_layout_not_its_prose(
    demo_corpus, tmp_path, monkeypatch
):
    """A corrected feature description (kiln.json's schema) reuses every
    record; a changed key or dtype, which changes the records' bytes, does not."""
    import dataclasses

    from kiln.pipeline import config as config_module
    from kiln.pipeline import incremental
    from kiln.schemas import RECORD

    config = config_module.load(make_config(demo_corpus.out_dir, output=str(tmp_path))).to_json()
    before = incremental.processing_fingerprint(config)

    def edited(**change):
        features = tuple(
            dataclasses.replace(f, **change) if f.name == "label" else f for f in RECORD.features
        )
        return dataclasses.replace(RECORD, features=features)

    monkeypatch.setattr(incremental, "RECORD", edited(description="Reworded."))
    assert incremental.processing_fingerprint(config) == before
    monkeypatch.setattr(incremental, "RECORD", edited(key="image/class/id"))
    assert incremental.processing_fingerprint(config) != before
    monkeypatch.setattr(incremental, "RECORD", edited(dtype="float32"))
    assert incremental.processing_fingerprint(config) != before


def test_label_description_names_where_the_class_names_are(demo_corpus, tmp_path):
    """With ``source.classes`` in an order of its own the ids are not indices
    into sorted names: kiln.json's schema points at its ``class_names``."""
    classes = ["triangle", "circle", "star", "square"]
    config = make_config(demo_corpus.out_dir, output=str(tmp_path))
    config["source"]["classes"] = classes
    result = build(config)
    with open(os.path.join(result.dataset_dir, "kiln.json")) as f:
        info = json.load(f)
    assert info["class_names"] == classes
    (label,) = [f for f in info["schema"]["features"] if f["name"] == "label"]
    assert "sorted" not in label["description"]
    assert "class_names" in label["description"]


def test_record_index_lines_round_trip():
    entry = record_index.entry(
        key="a/1.png",
        sha256="ab" * 32,
        inputs="cd" * 16,
        label=2,
        height=3,
        width=4,
        pixels=12,
        sums=(1, 2, 3),
        squares=(4, 5, 6),
    )
    text = record_index.part_bytes("train", "x-train.tfrecord-00000-of-00001", [entry, entry])
    lines = text.decode().splitlines()
    rows = [record_index.parse_line(line) for line in lines]
    assert [r.position for r in rows] == [0, 1]
    assert rows[0].entry() == entry
    # A reused record carries its base line, placement and all, and gets the
    # same line in its new place as its entry would give.
    assert rows[0].reused_entry() == lines[0].encode()
    moved = record_index.part_bytes("val", "x-val.tfrecord-00000-of-00001", [entry, entry])
    assert (
        record_index.part_bytes(
            "val", "x-val.tfrecord-00000-of-00001", [r.reused_entry() for r in rows]
        )
        == moved
    )
    assert json.loads(lines[0]) == dict(
        json.loads(entry), split="train", shard="x-train.tfrecord-00000-of-00001", position=0
    )
    with pytest.raises(ValueError, match="not a record index line"):
        record_index.parse_line('{"key": "x"}')
    assert hashlib.sha256(text).hexdigest()  # bytes, deterministic


@pytest.mark.parametrize(
    "key",
    ["a/1.png", 'quote"d,"position":1,"sha256":"x", and \\', "ünï/cödé ✓.jpg", 'k,"squares":'],
)
@pytest.mark.parametrize("with_targets", [False, True])
def test_index_lines_spliced_are_the_lines_parsing_gives(key, with_targets):
    entry = record_index.entry(
        key=key,
        sha256="ab" * 32,
        inputs="cd" * 16,
        label=-1 if with_targets else 7,
        height=3,
        width=4,
        pixels=12,
        sums=(1, 2, 3),
        squares=(4, 5, 6),
        targets=TargetCounts((1, 3), True, ((1, 2.5), (3, 0.1)), (("tiny", 2),))
        if with_targets
        else None,
    )
    line = record_index.part_bytes("old", "a-old.tfrecord-00003-of-00009", [entry]).rstrip()

    def parsed(split, shard, entries):  # what part_bytes gave before splicing
        lines = []
        for position, raw in enumerate(entries):
            data = dict(json.loads(raw), split=split, shard=shard, position=position)
            text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            lines.append(f"{text}\n")
        return "".join(lines).encode("utf-8")

    for split, shard in (("train", "x-train.tfrecord-00000-of-00001"), ("vål", "ds-vål-1")):
        entries = [entry, line, entry, line]
        assert record_index.part_bytes(split, shard, entries) == parsed(split, shard, entries)
    placement = b',"shard":"s","split":"t"'
    assert record_index._placed(entry, 5, placement) is not None  # spliced, not parsed
    assert record_index._placed(line, 5, placement) is not None
    # Not laid out as an entry or a line: parsed.
    odd = json.dumps({"key": "k", "sha256": "s", "extra": 1}).encode()
    assert record_index.part_bytes("t", "s", [odd]) == parsed("t", "s", [odd])
    assert record_index._placed(odd, 0, b"") is None


def test_base_and_full_exclude_each_other_and_the_base_must_exist(demo_corpus, tmp_path):
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    with pytest.raises(UsageError, match="exclude each other"):
        build(config, base="0123456789ab", full=True)
    with pytest.raises(UsageError, match="no complete version 0123456789ab"):
        build(config, base="0123456789ab")
    assert not [n for n in os.listdir(tmp_path / "out" / "shapes") if not n.startswith(".")]


def stored_per_class(result) -> dict[str, int]:
    counts: dict[str, int] = {}
    for split in result.info.splits.values():
        for name, count in split.class_counts.items():
            counts[name] = counts.get(name, 0) + count
    return counts


def shards_holding(result, keys) -> set[str]:
    """The shards of `result` that hold a record of one of `keys`."""
    return {row.shard for row in index_rows(result) if row.key in keys}


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_new_class_relabels_the_records_whose_ids_it_shifts(
    demo_corpus, tmp_path, monkeypatch, compression
):
    """ "oval" sorts between circle and square: square, star and triangle
    move up one id. Their records are not decoded: the shard writer copies
    them from the base's shards as it copies reused records, rewriting the
    id in the copied frame (no sorted run, no base record read on its own;
    a gzip base streamed as for reused records). Both give a full build's
    bytes."""
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(
        images, output=str(tmp_path / "out"), sharding={"num_shards": 2, "compression": compression}
    )
    base = build(config)
    before = stored_per_class(base)
    (images / "oval").mkdir()
    (images / "oval" / "oval_0000.png").write_bytes(new_png(3))
    spilled = spilled_keys(monkeypatch)

    incremental = build(config)

    assert incremental.info.class_names == ["circle", "oval", "square", "star", "triangle"]
    report = incremental.incremental
    shifted = before["square"] + before["star"] + before["triangle"]
    assert report.used and report.reused == before["circle"]
    assert (report.relabelled, report.changed, report.added) == (shifted, 0, 1)
    assert incremental.counters["images_decoded"] == 1
    assert f"relabelled {shifted}, processed" in summary(incremental)
    # Only the new image went through a run: every base record was copied.
    assert len(spilled) == 1
    assert incremental.counters["records_copied"] == before["circle"] + shifted
    assert "base_shards_read" not in incremental.counters
    assert_same_dataset(incremental, full_build(config, tmp_path))


@pytest.mark.parametrize("damage", ["flipped", "truncated", "after-its-check"])
def test_a_damaged_gzip_base_shard_has_the_records_to_relabel_processed(
    demo_corpus, tmp_path, monkeypatch, damage
):
    """A class that sorts first shifts every id: every record is relabelled
    from the gzip base, except those of a damaged shard, which are processed
    from their files: a shard whose sha256 differs (a byte flipped, cut
    short) is not trusted, and the result is a full build's bytes. One
    replaced after its check fails the build where the shard writer copies
    its records (as for reused records): none is rewritten from it."""
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(
        images, output=str(tmp_path / "out"), sharding={"num_shards": 2, "compression": "gzip"}
    )
    base = build(config)
    stored_before = sum(s.num_examples for s in base.info.splits.values())
    damaged = base.info.splits["train"].shards[1]
    path = os.path.join(base.dataset_dir, damaged.filename)
    os.chmod(path, 0o644)

    def spoil():
        data = bytearray(open(path, "rb").read())
        if damage == "flipped":
            data[len(data) // 2] ^= 0xFF  # inside the compressed records
        elif damage == "truncated":
            del data[len(data) // 2 :]
        else:  # replaced: none of its records can be read any more
            data = bytearray(b"no longer a shard")
        with open(path, "wb") as f:
            f.write(data)

    if damage == "after-its-check":
        check = incremental_module._check_file

        def check_then_damage(name_and_sha256, folder, compression):
            result = check(name_and_sha256, folder, compression)
            if name_and_sha256[0] == damaged.filename:
                spoil()
            return result

        monkeypatch.setattr(incremental_module, "_check_file", check_then_damage)
    else:
        spoil()
    (images / "aaa").mkdir()
    (images / "aaa" / "aaa_0000.png").write_bytes(new_png(3))

    if damage == "after-its-check":
        with pytest.raises(BuildError, match=f"{damaged.filename}: does not inflate"):
            build(config)
        assert publish.DatasetRoot(str(tmp_path / "out" / "shapes")).latest() == base.version
        return
    incremental = build(config)

    report = incremental.incremental
    assert report.used and report.reused == 0
    assert report.relabelled == stored_before - damaged.num_records
    # Stored from their files: the new image, and the damaged shard's (not new).
    assert (report.added, report.changed, report.reprocessed) == (1, 0, damaged.num_records)
    assert incremental.counters["images_decoded"] == damaged.num_records + 1
    # Named by its sha256 even where it no longer inflates.
    assert f"{damaged.filename}: sha256 differs" in report.reason
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_a_class_gone_relabels_the_classes_after_it(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    before = stored_per_class(base)
    shutil.rmtree(images / "square")

    incremental = build(config)

    assert incremental.info.class_names == ["circle", "star", "triangle"]
    report = incremental.incremental
    assert report.reused == before["circle"]
    assert report.relabelled == before["star"] + before["triangle"]
    assert report.deleted == before["square"]
    assert incremental.counters.get("images_decoded", 0) == 0
    assert_same_dataset(incremental, full_build(config, tmp_path))
