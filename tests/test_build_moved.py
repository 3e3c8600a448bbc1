"""Incremental builds where files moved to another key (renamed, moved to
another folder or class, a class folder renamed, a manifest's paths
changed): their records are rewritten from the base's records of the same
bytes, not decoded (`kiln.pipeline.moves`), and every file of the version
is byte-identical to a from-scratch build of the same inputs (real
DirectRunner builds)."""

import array
import csv
import hashlib
import os
import shutil

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that

import targets_data as data
from conftest import make_config, read_tree
from kiln import transforms
from kiln.pipeline import build, moves, record_index
from kiln.pipeline.command import summary
from kiln.pipeline.config import EncodingConfig, ImageConfig, SplitsConfig
from kiln.pipeline.images import ImageProcessor
from kiln.pipeline.incremental import PackDigestsFn
from kiln.pipeline.splits import SplitPolicy
from test_build_incremental import (
    copy_corpus,
    good_keys,
    index_rows,
    shards_holding,
    stored_per_class,
)
from test_targets_build import config as targets_config
from test_targets_incremental import COUNT, read_rows, write_rows


def assert_same_tree(incremental, full):
    assert incremental.version == full.version
    # Every file of the version: shards, index.jsonl, kiln.json, the reports.
    assert read_tree(incremental.dataset_dir) == read_tree(full.dataset_dir)
    assert incremental.info == full.info


def full_build(config, tmp_path):
    return build(dict(config, output=str(tmp_path / "full")))


def decoded(result) -> int:
    return result.counters.get("images_decoded", 0)


def stored(result) -> int:
    return sum(split.num_examples for split in result.info.splits.values())


@pytest.mark.parametrize(
    "pipeline_args",
    [[], ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]],
    ids=["in-process", "two-worker-processes"],
)
def test_a_file_renamed_in_its_class_folder_is_moved_not_decoded(
    demo_corpus, tmp_path, pipeline_args
):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"), sharding={"num_shards": 2})
    base = build(config)
    old = good_keys(demo_corpus, images)[3]
    new = old.replace(".", "_renamed.", 1)
    os.rename(images / old, images / new)

    incremental = build(config, pipeline_args)

    assert decoded(incremental) == 0
    report = incremental.incremental
    assert (report.moved, report.added, report.deleted) == (1, 0, 1)
    assert report.reused == stored(base) - 1
    # Processed: none (the three broken files are dropped again unread).
    assert report.processed == 0 and report.dropped_again == 3
    assert "moved 1, processed 0 (0 new, 0 changed, 0 dropped), 1 gone" in summary(incremental)
    assert new in {row.key for row in index_rows(incremental)}
    assert_same_tree(incremental, full_build(config, tmp_path))


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_class_folder_renamed_moves_its_records_with_new_class_ids(
    demo_corpus, tmp_path, compression
):
    """square -> box: [box, circle, star, triangle]. The square records move
    to the new key and id (1 -> 0), circle's are relabelled (0 -> 1), star
    and triangle keep theirs. From a gzip base, where one record cannot be
    read alone, each base shard holding records to move is inflated once
    for all of them; the relabelled ones are copied by the shard writer,
    as reused records are, their ids rewritten in the copy."""
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(
        images, output=str(tmp_path / "out"), sharding={"num_shards": 3, "compression": compression}
    )
    base = build(config)
    before = stored_per_class(base)
    os.rename(images / "square", images / "box")

    incremental = build(config)

    assert incremental.info.class_names == ["box", "circle", "star", "triangle"]
    report = incremental.incremental
    assert decoded(incremental) == 0
    assert (report.moved, report.relabelled) == (before["square"], before["circle"])
    assert f"relabelled {before['circle']}, moved {before['square']}, processed" in summary(
        incremental
    )
    if compression == "gzip":  # one pass per base shard holding records that moved
        keys = {row.key for row in index_rows(base) if row.key.startswith("square/")}
        assert incremental.counters["base_shards_read"] == len(shards_holding(base, keys))
    stored_before = sum(before.values())
    assert incremental.counters["records_copied"] == stored_before - before["square"]
    assert report.reused == before["star"] + before["triangle"]
    assert report.deleted == before["square"]
    assert_same_tree(incremental, full_build(config, tmp_path))


def test_a_file_moved_to_another_class_takes_that_class(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    base = build(config)
    circle = next(key for key in good_keys(demo_corpus, images) if key.startswith("circle/"))
    moved = "star/" + circle.split("/", 1)[1]
    os.rename(images / circle, images / moved)

    incremental = build(config)

    assert decoded(incremental) == 0
    assert incremental.incremental.moved == 1
    after = stored_per_class(incremental)
    before = stored_per_class(base)
    assert (after["circle"], after["star"]) == (before["circle"] - 1, before["star"] + 1)
    (row,) = [row for row in index_rows(incremental) if row.key == moved]
    assert incremental.info.class_names[row.label] == "star"
    assert_same_tree(incremental, full_build(config, tmp_path))


def write_csv_manifest(path, keys, prefix):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for key in keys:
            writer.writerow([f"{prefix}/{key}", key.split("/", 1)[0]])
    return str(path)


def test_a_manifest_whose_paths_changed_prefix_moves_every_record(demo_corpus, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(demo_corpus.out_dir, folder / "images")
    keys = good_keys(demo_corpus, folder / "images")
    manifest = write_csv_manifest(folder / "manifest.csv", keys, "images")
    config = make_config(
        folder, output=str(tmp_path / "out"), source={"type": "manifest", "path": manifest}
    )
    base = build(config)
    os.rename(folder / "images", folder / "photos")
    write_csv_manifest(folder / "manifest.csv", keys, "photos")

    incremental = build(config)

    assert decoded(incremental) == 0
    report = incremental.incremental
    assert (report.moved, report.reused, report.deleted) == (len(keys), 0, len(keys))
    assert stored(incremental) == stored(base) == len(keys)
    assert {row.key for row in index_rows(incremental)} == {f"photos/{key}" for key in keys}
    assert_same_tree(incremental, full_build(config, tmp_path))


def test_duplicates_where_copies_moved_give_a_full_builds_bytes(demo_corpus, tmp_path):
    """Three files of the same bytes in the base; one stays, two move (one
    to another class). Both moved files are served by a base record of their
    bytes whose key is gone; duplicates.jsonl names the new keys."""
    images = copy_corpus(demo_corpus, tmp_path)
    original = next(key for key in good_keys(demo_corpus, images) if key.startswith("circle/"))
    shutil.copyfile(images / original, images / "circle/copy_a.png")
    shutil.copyfile(images / original, images / "circle/copy_b.png")
    config = make_config(images, output=str(tmp_path / "out"), sharding={"num_shards": 2})
    base = build(config)
    assert base.info.duplicates == 2
    os.rename(images / "circle/copy_a.png", images / "circle/zz_copy.png")
    os.rename(images / "circle/copy_b.png", images / "star/copy_b.png")

    incremental = build(config)

    assert decoded(incremental) == 0
    report = incremental.incremental
    assert (report.moved, report.reused) == (2, stored(base) - 2)
    assert incremental.info.duplicates == 2
    assert_same_tree(incremental, full_build(config, tmp_path))


def test_a_moved_file_whose_annotations_changed_is_processed_from_its_file(tmp_path):
    """A targets dataset (boxes, semantic and instance masks, keypoints,
    labels, extras) whose images moved to another folder: each record is
    moved, except the one whose box also moved and the one whose image
    class changed (its class counts in the statistics): those are decoded."""
    folder = tmp_path / "data"
    manifest, _ = data.corpus(folder, COUNT)
    spec = targets_config(manifest, tmp_path / "out")
    build(spec)
    rows = read_rows(folder)
    os.rename(folder / "images", folder / "moved")
    for row in rows:
        row["path"] = row["path"].replace("images/", "moved/", 1)
    with_boxes = [i for i, row in enumerate(rows) if row["objects"]]
    box_changed, label_changed = with_boxes[0], with_boxes[1]
    box = rows[box_changed]["objects"][0]["bbox"]
    rows[box_changed]["objects"][0]["bbox"] = [box[0] + 1, box[1], box[2] + 1, box[3]]
    rows[label_changed]["label"] = next(
        name for name in data.CLASSES if name != rows[label_changed]["label"]
    )
    write_rows(folder, rows)

    incremental = build(spec)

    assert decoded(incremental) == 2
    report = incremental.incremental
    assert (report.moved, report.added, report.reused) == (COUNT - 2, 2, 0)
    assert_same_tree(incremental, build(dict(spec, output=str(tmp_path / "full"))))


def test_a_moved_file_takes_the_base_record_whose_key_sorts_first(tmp_path):
    """Several base records of the same bytes (duplicates whose keys are
    gone): the file's record is rewritten from the one whose key sorts
    first, whatever order the join gives them in; one that cannot be read
    is passed over for the next. The result is the record a from-scratch
    build writes."""
    processor = ImageProcessor(
        transforms.parse([]),
        ImageConfig(channels=3, max_pixels=1_000_000, min_size=1),
        EncodingConfig(format="png"),
        ["a", "b"],
        SplitPolicy.from_config(SplitsConfig(fractions={"train": 1.0})),
        base_class_names=["a", "b"],
    )
    source = tmp_path / "image.png"
    data.write_png(source, data.image_of(data.objects_of(1)))
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()

    def item(key, label):
        return {"key": key, "uri": str(source), "label": label, "split": None, "size": 1}

    def processed(key, label):
        outcome = processor(item(key, label))
        assert outcome.image is not None
        return outcome.image

    base_keys = ["b/zeta.png", "a/beta.png", "b/alpha.png"]
    records = {}
    rows = []
    for position, key in enumerate(base_keys):
        image = processed(key, "ab".index(key[0]))
        records[("shard", position)] = image.record
        entry = record_index.parse_line(
            record_index.part_bytes("train", "shard", [image.index_entry]).decode()
        )
        rows.append(tuple(entry._replace(position=position, line="")))
    fresh = processed("a/new.png", 0)

    reads = []

    def read_base(shard, position, unreadable=()):
        reads.append(base_keys[position])
        return None if base_keys[position] in unreadable else records[(shard, position)]

    for order in (rows, rows[::-1], rows[1:] + rows[:1]):
        reads.clear()
        moved = dict(item("a/new.png", 0), base=None, moved_from=(sha256, tuple(order)))
        outcome = processor(moved, read_base=read_base)
        assert outcome.moved and reads == ["a/beta.png"]
        assert outcome.image.record == fresh.record
        assert outcome.image.index_entry == fresh.index_entry

        reads.clear()
        outcome = processor(
            moved, read_base=lambda s, p: read_base(s, p, unreadable={"a/beta.png"})
        )
        assert outcome.moved and reads == ["a/beta.png", "b/alpha.png"]
        assert outcome.image.record == fresh.record

        # From a gzip base no record is read here: the file is handed on with
        # where the record it wants is, and run again with that record.
        later = processor(moved, read_later=True)
        assert (later.image, later.deferred) == (None, sha256)
        assert later.wanted == ("shard", base_keys.index("a/beta.png"))
        wanted = later.wanted
        outcome = processor(
            moved,
            read_base=lambda s, p, wanted=wanted: records[(s, p)] if (s, p) == wanted else None,
        )
        assert outcome.moved and outcome.image.record == fresh.record
        assert outcome.image.index_entry == fresh.index_entry


def test_a_copy_of_a_file_that_stays_is_processed(demo_corpus, tmp_path):
    """Only base records whose key is gone serve a moved file: a copy of a
    file still listed under its own key is decoded (and reported as a
    duplicate)."""
    images = copy_corpus(demo_corpus, tmp_path)
    config = make_config(images, output=str(tmp_path / "out"))
    build(config)
    original = good_keys(demo_corpus, images)[7]
    shutil.copyfile(images / original, images / "star/zz_copy.png")

    incremental = build(config)

    assert decoded(incremental) == 1
    assert (incremental.incremental.moved, incremental.incremental.added) == (0, 1)
    assert incremental.info.duplicates == 1
    assert_same_tree(incremental, full_build(config, tmp_path))


@pytest.mark.parametrize("mask", [False, True], ids=["without-mask", "semantic-mask"])
def test_files_moved_while_a_class_was_added(tmp_path, mask):
    """Every image moved to another folder and a class added that shifts
    every class id. Without a semantic mask each record is moved, its key
    and class ids (label, labels, the objects' classes) rewritten; with one
    (its pixel values are ids of the list) each is processed from its file."""
    folder = tmp_path / "data"
    manifest, _ = data.corpus(folder, COUNT)
    targets = {kind: value for kind, value in data.TARGETS.items() if mask or kind != "mask"}
    spec = targets_config(manifest, tmp_path / "out", targets=targets)
    build(spec)
    if mask:  # a semantic mask's class list is declared (its ids): amber is declared first
        spec["source"] = dict(spec["source"], classes=["amber", *data.CLASSES])
    rows = read_rows(folder)
    os.rename(folder / "images", folder / "moved")
    for row in rows:
        row["path"] = row["path"].replace("images/", "moved/", 1)
    # "amber" sorts first: every class id of the corpus moves up by one.
    data.write_png(
        folder / "moved" / "amber.png", np.full((data.HEIGHT, data.WIDTH, 3), 90, np.uint8)
    )
    data.write_png(folder / "masks" / "amber.png", data.semantic_mask_of([]))
    rows.append(dict(rows[0], path="moved/amber.png", label="amber", labels=["amber"], objects=[]))
    rows[-1]["mask"] = "masks/amber.png"
    write_rows(folder, rows)

    incremental = build(spec)

    assert incremental.info.class_names[0] == "amber"
    report = incremental.incremental
    if mask:
        assert decoded(incremental) == COUNT + 1
        assert (report.moved, report.added) == (0, COUNT + 1)
    else:
        assert decoded(incremental) == 1
        assert (report.moved, report.added) == (COUNT, 1)
    assert_same_tree(incremental, build(dict(spec, output=str(tmp_path / "full"))))


def test_the_orphans_digests_reach_the_image_step_packed_8_bytes_each():
    """The moved-files side input is one bytes value: the orphans' sha256
    prefixes, sorted, 8 bytes each (as Python ints in a list side input
    they would take about 36 bytes each, on every worker), the same bytes
    whatever order they come in, and `moves.Digests` answers from it as it
    is."""
    count = 30_000
    sha256s = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(count)]
    # A sha256 of several orphans (duplicate files) is one prefix.
    orphans = [(sha256, ()) for sha256 in sha256s + sha256s[:100]]
    others = [hashlib.sha256(f"other {i}".encode()).hexdigest() for i in range(1000)]

    def check(values):
        (packed,) = values
        assert isinstance(packed, bytes) and len(packed) == 8 * count
        prefixes = array.array("Q", packed)
        assert list(prefixes) == sorted({moves.digest_prefix(s) for s in sha256s})
        assert packed == moves.pack(array.array("Q", reversed(prefixes)))
        digests = moves.Digests(packed)
        assert len(digests) == count and digests.nbytes == len(packed)
        assert all(sha256 in digests for sha256 in sha256s)
        assert not any(sha256 in digests for sha256 in others)

    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        packed = (
            p
            | beam.Create(orphans, reshuffle=True)
            | beam.CombineGlobally(PackDigestsFn()).without_defaults()
        )
        assert_that(packed, check)
    assert len(moves.Digests()) == 0 and "0" * 64 not in moves.Digests(b"")
