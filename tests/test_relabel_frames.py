"""Records relabelled where the shard writer copies them (`relabel.FrameRelabel`):
a class added or removed shifts the class ids, and the ids are rewritten in
the base's frames as they are copied, giving the bytes that decoding,
relabelling and serializing the record again gives; where an id changes its
varint width (127 -> 128) the records are rewritten in the image step
instead. Real builds on the DirectRunner are byte-identical to builds from
scratch."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import targets_data as data
from conftest import make_config
from kiln.pipeline import BuildError, build, incremental, publish, sharding, tfrecord
from kiln.pipeline.relabel import Relabel
from kiln.schemas import RECORD, TargetsConfig, schema_for
from test_build_incremental import (
    assert_same_dataset,
    damage_records_after_their_check,
    new_png,
    spilled_keys,
)
from test_targets_build import config as targets_config
from test_targets_incremental import COUNT, read_rows, write_rows

DETECTION = schema_for(TargetsConfig.model_validate({"label": {}, "labels": {}, "boxes": {}}))


def names(count: int, prefix: str = "c") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(count)]


def classification_record(label: int, key: str = "cats/1.png") -> bytes:
    return RECORD.encode(
        {
            "image": bytes(range(256)) * 3,
            "height": 4,
            "width": 300,
            "channels": 3,
            "label": label,
            "key": key,
            "sha256": "ab" * 32,
        }
    )


def detection_record(label: int, labels: list[int], classes: list[int]) -> bytes:
    return DETECTION.encode(
        {
            "image": b"\x89PNG" + bytes(200),
            "height": 10,
            "width": 20,
            "channels": 3,
            "label": label,
            "key": "a/b.png",
            "sha256": "cd" * 32,
            "labels": np.asarray(labels, np.int64),
            "boxes": np.tile(np.asarray([[0.1, 0.2, 0.3, 0.4]], np.float32), (len(classes), 1)),
            "classes": np.asarray(classes, np.int64),
        }
    )


@pytest.mark.parametrize(
    "base_names, new_names",
    [
        (names(5), ["a", *names(5)]),  # every id up by one
        (names(5), names(5)[1:]),  # down by one (c000 gone)
        (names(300), sorted([*names(300), "c200x"])),  # two-byte ids up: 201..299 -> 202..300
        (names(129), names(129)[:60] + names(129)[61:]),  # 128 -> 127 is not rewritten here
    ],
    ids=["added-first", "removed-first", "two-byte-ids", "width-changes"],
)
def test_ids_rewritten_in_the_frame_are_the_bytes_of_the_record_relabelled(base_names, new_names):
    """Every id of ``label``, ``labels`` and ``classes`` (the objects'),
    rewritten in the frame's bytes: the record `Relabel.record` gives, in
    an intact frame of the same length. A map where an id changes its
    varint width gives no `FrameRelabel` (the lengths would change)."""
    relabel = Relabel(base_names, new_names, DETECTION)
    frames = relabel.frame_relabel()
    mapped = {i: new_names.index(name) for i, name in enumerate(base_names) if name in new_names}
    if any((old < 128) != (new < 128) for old, new in mapped.items()):
        assert frames is None
        assert Relabel(base_names, new_names, RECORD).frame_relabel() is None
        return
    assert frames is not None
    kept = sorted(mapped)
    picks = [kept[0], kept[len(kept) // 2], kept[-1]]
    for label in picks:
        record = detection_record(label, sorted(set(picks)), [kept[-1], label, kept[0], label])
        framed = tfrecord.frame(record)
        rewritten = frames.frame(memoryview(framed))
        expected = tfrecord.frame(relabel.record(record, mapped[label], "a/b.png"))
        assert rewritten == expected and len(rewritten) == len(framed)
        assert tfrecord.is_frame(rewritten)
    classification = Relabel(base_names, new_names, RECORD).frame_relabel()
    assert classification is not None
    record = classification_record(kept[-1])
    assert classification.frame(tfrecord.frame(record)) == tfrecord.frame(
        Relabel(base_names, new_names, RECORD).record(record, mapped[kept[-1]], "cats/1.png")
    )


def test_a_record_with_an_id_the_map_does_not_know_is_not_rewritten():
    frames = Relabel(names(5), names(5)[1:], RECORD).frame_relabel()
    assert frames is not None
    with pytest.raises(ValueError, match="class id 0 is not one of the base's classes"):
        frames.frame(tfrecord.frame(classification_record(0)))  # c000 is gone
    with pytest.raises(ValueError, match=r"not a tf\.train\.Example"):
        frames.frame(tfrecord.frame(b"\x0a\xff"))  # a field longer than the record
    with pytest.raises(ValueError, match=r"no int64 feature 'image/class/label'"):
        frames.frame(tfrecord.frame(b"\x10\x01"))  # protobuf, but not a kiln record


def relabelled_slice(path, starts, positions, compression=None):
    entries = tuple(
        (f"{position:016x}", starts[position], starts[position + 1] - starts[position], b"{}")
        for position in positions
    )
    return sharding.ReusedSlice(path, compression, entries, relabelled=True)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_the_shard_writer_relabels_checked_frames_and_refuses_damaged_ones(tmp_path, compression):
    """`read_reused` checks each frame of a relabelled slice before it
    rewrites it: a record changed after the base's check fails the copy,
    as a reused record does, instead of being rewritten; so does a record
    whose ids are not the base's classes (not the record its index says)."""
    gzip = None if compression == "none" else "gzip"
    relabel = Relabel(names(5), ["a", *names(5)], RECORD)
    frames = relabel.frame_relabel()
    records = [classification_record(i % 5, f"k{i}") for i in range(8)]
    path = str(tmp_path / "base")
    record_frames = [tfrecord.frame(record) for record in records]
    info = sharding.write_frames(path, str(tmp_path / "base.tmp"), record_frames, compression)
    _, (problem, found) = incremental._check_file(("base", info.sha256), str(tmp_path), gzip)
    assert problem == ""
    starts = incremental.frame_starts(found)

    copied = sharding.read_reused([relabelled_slice(path, starts, [1, 4, 6], gzip)], frames)

    assert [framed for _, framed, _ in copied] == [
        tfrecord.frame(relabel.record(records[p], p % 5 + 1, f"k{p}")) for p in (1, 4, 6)
    ]
    with pytest.raises(ValueError, match="without the class id map"):
        sharding.read_reused([relabelled_slice(path, starts, [1], gzip)])
    gone = Relabel(names(5), names(5)[1:], RECORD).frame_relabel()
    with pytest.raises(OSError, match="at offset 0 cannot be relabelled"):
        sharding.read_reused([relabelled_slice(path, starts, [0], gzip)], gone)
    if gzip is None:
        raw = bytearray(open(path, "rb").read())
        raw[starts[4] + 20] ^= 0xFF  # inside record 4's data
        with open(path, "wb") as f:
            f.write(raw)
        with pytest.raises(OSError, match="changed after its check"):
            sharding.read_reused([relabelled_slice(path, starts, [3, 4], gzip)], frames)


def class_folders(root, count: int) -> None:
    for index, name in enumerate(names(count)):
        (root / name).mkdir(parents=True)
        (root / name / "img.png").write_bytes(new_png(100 + index))


@pytest.mark.parametrize("classes", [127, 128])
def test_a_class_added_across_the_one_byte_ids_gives_a_full_builds_bytes(
    tmp_path, monkeypatch, classes
):
    """A class that sorts first moves every id up by one. With 127 classes
    every id stays a one-byte varint: the records are copied, their ids
    rewritten in the copy. With 128, id 127 becomes 128, two bytes: every
    record is rewritten in the image step and goes through the runs. Both
    are a full build's bytes."""
    images = tmp_path / "images"
    class_folders(images, classes)
    config = make_config(
        images, output=str(tmp_path / "out"), sharding={"num_shards": {"train": 2}}
    )
    build(config)
    (images / "a").mkdir()
    (images / "a" / "img.png").write_bytes(new_png(7))
    spilled = spilled_keys(monkeypatch)

    result = build(config)

    report = result.incremental
    assert (report.relabelled, report.reused, report.added) == (classes, 0, 1)
    assert result.counters["images_decoded"] == 1
    if classes == 127:
        assert result.counters["records_copied"] == classes and len(spilled) == 1
    else:
        assert "records_copied" not in result.counters and len(spilled) == classes + 1
    monkeypatch.undo()
    assert_same_dataset(result, build(dict(config, output=str(tmp_path / "full"))))


def test_multi_label_and_object_classes_relabelled_from_a_gzip_base(tmp_path):
    """Records with an image label, ``labels`` and per-object ``classes``
    (and keypoints, instance masks, extras), in a gzip base: every id moved
    up by one, rewritten as the shard writer streams the base's frames."""
    folder = tmp_path / "data"
    data.corpus(folder, COUNT)
    targets = {kind: value for kind, value in data.TARGETS.items() if kind != "mask"}
    spec = targets_config(
        str(folder / "manifest.jsonl"),
        tmp_path / "out",
        targets=targets,
        sharding={"num_shards": 2, "compression": "gzip"},
    )
    build(spec)
    rows = read_rows(folder)
    data.write_png(folder / "images" / "amber.png", np.full((48, 64, 3), 90, np.uint8))
    rows.append(
        {
            "path": "images/amber.png",
            "label": "amber",
            "labels": ["amber"],
            "objects": [],
            "weather": "fog",
            "altitude": 1.0,
            "year": 1999,
        }
    )
    write_rows(folder, rows)

    result = build(spec)

    assert result.info.class_names[0] == "amber"
    report = result.incremental
    assert (report.relabelled, report.added) == (COUNT, 1)
    assert result.counters["records_copied"] == COUNT
    assert "base_shards_read" not in result.counters
    assert_same_dataset(result, build(dict(spec, output=str(tmp_path / "full"))))


def test_a_relabelled_records_base_shard_changed_after_its_check_fails_the_build(
    demo_corpus, tmp_path, monkeypatch
):
    """An uncompressed base whose records are all relabelled, a byte of
    every record flipped after the base's check: the shard writer finds the
    frames damaged and the build fails, as with reused records; nothing is
    rewritten from them or published."""
    images = tmp_path / "images"
    shutil.copytree(demo_corpus.out_dir, images)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    (images / "aaa").mkdir()
    (images / "aaa" / "aaa_0000.png").write_bytes(new_png(3))
    damage_records_after_their_check(monkeypatch)

    with pytest.raises(BuildError, match="changed after its check"):
        build(config)
    assert publish.DatasetRoot(str(tmp_path / "out" / "shapes")).latest() == base.version
