"""Multi-label manifests with extra columns, as a nightly export writes them (real
pipelines on the DirectRunner, records read back with the dataset's schema).

An export is data kiln does not control: a value too large for the record's
type is one bad row, not a failed build or a silently different value.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
import targets_data as data
from kiln import cli
from kiln.errors import ConfigError
from kiln.pipeline import build
from kiln.pipeline.command import summary
from kiln.schemas import METADATA_FILENAME, Schema
from kiln.tools import inspection
from test_build_incremental import assert_same_dataset
from test_targets_build import error_rows, records

TARGETS = {"labels": {}, "extra": {"camera": "int", "exposure": "float"}}
CLASSES = ["bird", "cat", "dog"]


def images(folder: pathlib.Path, count: int) -> list[str]:
    paths = []
    for index in range(count):
        path = f"images/{index:03d}.png"
        pixels = np.full((data.HEIGHT, data.WIDTH, 3), 10 * index, np.uint8)
        data.write_png(folder / path, pixels)
        paths.append(path)
    return paths


def config(manifest: pathlib.Path, output: pathlib.Path, **overrides) -> dict:
    spec = {
        "name": "tags",
        "source": {"type": "manifest", "path": str(manifest), "classes": CLASSES},
        "output": str(output),
        "encoding": {"format": "png"},
        "targets": TARGETS,
        "errors": {"max_fraction": 0.8},
    }
    spec.update(overrides)
    return spec


def test_extra_values_the_record_cannot_hold_are_bad_rows(tmp_path):
    paths = images(tmp_path, 6)
    too_large = 2**70
    csv_rows = [
        f"{paths[0]},bird|cat,1,0.5",
        f"{paths[1]},,2,1.5",
        f"{paths[2]},dog,{too_large},0.5",  # beyond int64
        f"{paths[3]},dog,-{too_large},0.5",
        f"{paths[4]},dog,3,1e300",  # finite, beyond float32
        f"{paths[5]},cat,4,-1e39",
    ]
    csv = tmp_path / "tags.csv"
    csv.write_text("path,labels,camera,exposure\n" + "\n".join(csv_rows) + "\n")
    jsonl = tmp_path / "tags.jsonl"
    json_rows = [
        {"path": paths[0], "labels": ["bird", "cat"], "camera": 1, "exposure": 0.5},
        {"path": paths[1], "labels": [], "camera": 2, "exposure": 1.5},
        {"path": paths[2], "labels": ["dog"], "camera": too_large, "exposure": 0.5},
        {"path": paths[3], "labels": ["dog"], "camera": -too_large, "exposure": 0.5},
        {"path": paths[4], "labels": ["dog"], "camera": 3, "exposure": 1e300},
        {"path": paths[5], "labels": ["cat"], "camera": 4, "exposure": -1e39},
    ]
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in json_rows))
    for manifest in (csv, jsonl):
        result = build(config(manifest, tmp_path / manifest.suffix[1:]))

        errors = {row["key"]: row for row in error_rows(result)}
        first = 2 if manifest is csv else 1  # the line of the first row
        assert sorted(errors) == [f"{manifest.name}:{first + i}" for i in range(2, 6)]
        assert {row["reason"] for row in errors.values()} == {"bad_row"}
        assert errors[f"{manifest.name}:{first + 2}"]["message"] == (
            f"camera: {too_large} does not fit the record's 64-bit integer "
            f"({-(2**63)} to {2**63 - 1})"
        )
        assert errors[f"{manifest.name}:{first + 4}"]["message"] == (
            "exposure: 1e+300 does not fit the record's float32 (at most 3.402823e+38 in magnitude)"
        )
        got = records(result)
        assert sorted(got) == paths[:2]
        assert got[paths[0]]["labels"].tolist() == [0, 1]
        assert got[paths[0]]["camera"] == 1
        assert got[paths[1]]["exposure"] == np.float32(1.5)
        assert result.info.dropped == {"bad_row": 4}


def test_the_order_of_an_images_labels_is_not_a_change(tmp_path):
    """A nightly export that lists an image's labels in another order (or one
    twice) keeps the version: the records hold the sorted ids either way."""
    paths = images(tmp_path, 4)
    manifest = tmp_path / "tags.csv"

    def export(labels: list[str]) -> None:
        rows = [
            f"{path},{cell},{i},0.5"
            for i, (path, cell) in enumerate(zip(paths, labels, strict=True))
        ]
        manifest.write_text("path,labels,camera,exposure\n" + "\n".join(rows) + "\n")

    export(["bird|cat|dog", "cat|dog", "", "bird"])
    first = build(config(manifest, tmp_path / "out"))
    export(["dog|bird|cat", "dog|cat|dog", "", "bird|bird"])
    again = build(config(manifest, tmp_path / "out"))

    assert again.up_to_date
    assert again.version == first.version
    assert records(again)[paths[0]]["labels"].tolist() == [0, 1, 2]


def test_rows_of_one_image_whose_labels_differ_only_in_order_agree(tmp_path):
    paths = images(tmp_path, 3)
    rows = [
        {"path": paths[0], "labels": ["cat", "bird"], "camera": 1, "exposure": 0.5},
        {"path": paths[1], "labels": [], "camera": 2, "exposure": 0.5},
        {"path": paths[2], "labels": ["dog"], "camera": 3, "exposure": 0.5},
        {"path": paths[0], "labels": ["bird", "cat", "cat"], "camera": 1, "exposure": 0.5},
    ]
    manifest = tmp_path / "tags.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = build(config(manifest, tmp_path / "out"))

    assert error_rows(result) == []
    assert records(result)[paths[0]]["labels"].tolist() == [0, 1]
    assert result.info.splits["train"].class_counts == {"bird": 1, "cat": 1, "dog": 1}


def test_the_build_summary_names_label_ids_a_new_class_moved(tmp_path):
    """A class that sorts first moves every other class's id: the nightly
    summary says so, and a rebuild where no class's share moved says that
    rather than naming a class with "+0.0 points"."""
    paths = images(tmp_path, 4)
    manifest = tmp_path / "tags.csv"
    rows = [f"{paths[0]},bird|cat,1,0.5", f"{paths[1]},dog,2,0.5", f"{paths[2]},,3,0.5"]
    manifest.write_text("path,labels,camera,exposure\n" + "\n".join(rows) + "\n")
    build(config(manifest, tmp_path / "out"))
    rows[1] = f"{paths[1]},dog,2,0.75"  # an extra column's value only
    manifest.write_text("path,labels,camera,exposure\n" + "\n".join(rows) + "\n")
    same_shares = build(config(manifest, tmp_path / "out"))
    rows.append(f"{paths[3]},ant|dog,4,0.5")
    manifest.write_text("path,labels,camera,exposure\n" + "\n".join(rows) + "\n")
    source = {"type": "manifest", "path": str(manifest), "classes": ["ant", *CLASSES]}
    new_class = build(config(manifest, tmp_path / "out", source=source))

    line = summary(same_shares).splitlines()[-1]
    assert line.endswith("1 changed, 0 moved (33.3% of 3); class shares unchanged"), line
    assert "label ids changed" not in summary(same_shares)
    details = summary(new_class).splitlines()[-1]
    assert details.startswith("  label ids changed: 3 class(es) (bird, cat, dog)"), details


def negatives_per_split(result) -> dict[str, int]:
    """Records with no label at all, per split, read from the shards."""
    schema = Schema.from_json(result.info.schema)
    counts = {}
    for name, split in result.info.splits.items():
        paths = [os.path.join(result.dataset_dir, shard.filename) for shard in split.shards]
        decoded = (schema.decode(r.numpy()) for r in tf.data.TFRecordDataset(paths))
        counts[name] = sum(1 for record in decoded if not len(record["labels"]))
    return counts


def test_images_with_no_class_are_counted_per_split_and_shown(tmp_path, capsys):
    """A multi-label dataset's negatives (no label at all) are in no
    class_counts row: kiln.json counts them per split, inspect shows them and
    verify checks them against the records, incremental builds included."""
    paths = images(tmp_path, 8)
    manifest = tmp_path / "tags.csv"

    def export(cells: list[str]) -> None:
        rows = [f"{path},{cell},1,0.5" for path, cell in zip(paths, cells, strict=True)]
        manifest.write_text("path,labels,camera,exposure\n" + "\n".join(rows) + "\n")

    splits = {"fractions": {"train": 0.5, "test": 0.5}, "split_by": "key"}
    export(["bird", "", "cat|dog", "", "", "dog", "", "bird"])
    result = build(config(manifest, tmp_path / "out", splits=splits))
    expected = negatives_per_split(result)
    assert sum(expected.values()) == 4
    assert {n: s.images_without_classes for n, s in result.info.splits.items()} == expected

    assert cli.main(["inspect", result.dataset_dir]) == 0
    lines = capsys.readouterr().out.splitlines()
    (row,) = [line for line in lines if "(no class)" in line]
    order = list(inspection.inspect_dataset(result.dataset_dir)["splits"])
    counts = [str(expected[name]) for name in order] + ["4"]
    assert row.split() == ["(no", "class)", *counts, "(images", "with", "no", "class)"]
    # In the columns of the class rows above it (class names shorter than it).
    (cat,) = [line for line in lines if line.strip().startswith("cat ")]
    assert row.index("(images") == cat.index("(label")
    assert cli.main(["verify", result.dataset_dir, "--quiet"]) == 0

    # An incremental build reuses most records: their classes come from the index.
    export(["bird", "", "cat|dog", "", "cat", "dog", "", "bird"])
    again = build(config(manifest, tmp_path / "out", splits=splits))
    assert again.incremental is not None and again.incremental.reused > 0
    expected = negatives_per_split(again)
    assert sum(expected.values()) == 3
    assert {n: s.images_without_classes for n, s in again.info.splits.items()} == expected
    assert cli.main(["verify", again.dataset_dir, "--quiet"]) == 0


def test_a_classification_kiln_json_has_no_count_of_images_without_classes(build_dataset):
    # Every image has its label; the field stays out, so the file keeps its bytes.
    result = build_dataset()
    with open(os.path.join(result.dataset_dir, METADATA_FILENAME)) as f:
        assert "images_without_classes" not in f.read()
    assert all(s.images_without_classes is None for s in result.info.splits.values())


def test_a_reordered_class_list_gives_a_full_builds_bytes(tmp_path):
    """`source.classes` keeps its declared order, so reordering it permutes
    the class ids (not a monotone map): the records copied from the base
    with their ids rewritten keep ``labels`` ascending, byte for byte what a
    build from scratch stores."""
    paths = images(tmp_path, 4)
    manifest = tmp_path / "tags.csv"
    rows = [f"{paths[0]},bird|cat|dog,1,0.5", f"{paths[1]},cat|dog,2,0.5", f"{paths[2]},bird,3,0.5"]
    manifest.write_text("path,labels,camera,exposure\n" + "\n".join(rows) + "\n")
    build(config(manifest, tmp_path / "out"))
    source = {"type": "manifest", "path": str(manifest), "classes": ["dog", "bird", "cat"]}

    reordered = build(config(manifest, tmp_path / "out", source=source))
    full = build(config(manifest, tmp_path / "full", source=source))

    assert reordered.incremental.relabelled == 3
    assert_same_dataset(reordered, full)
    stored = {
        example["key"].numpy().decode(): list(example["labels"].numpy())
        for example in kiln.reader.load(
            reordered.dataset_dir, "train", augment=None, shuffle=False, as_supervised=False
        )
    }
    assert stored[paths[0]] == [0, 1, 2]  # dog, bird, cat: ascending ids
    assert stored[paths[1]] == [0, 2]


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path):
    """JSON allows U+2028, U+2029 and U+0085 unescaped inside a string, and
    ``json.dumps(..., ensure_ascii=False)`` (or pandas' ``to_json(force_ascii=
    False)``) writes them so: such a row is one row, not two bad ones, and the
    rows after it keep their line numbers."""
    paths = images(tmp_path, 3)
    rows = [
        {"path": paths[0], "labels": ["cat"], "note": "plain"},
        {"path": paths[1], "labels": ["dog"], "note": "two\u2028lines\u2029and\x85more"},
        {"path": paths[2], "labels": ["bird"], "note": "x", "comment": "undeclared\u2028key"},
    ]
    manifest = tmp_path / "tags.jsonl"
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows) + "{not json\n"
    assert "\u2028" in text and "\x85" in text
    manifest.write_text(text, encoding="utf-8")
    targets = {"labels": {}, "extra": {"note": "string"}}

    result = build(config(manifest, tmp_path / "out", targets=targets))

    stored = data.records(result)
    assert sorted(stored) == sorted(paths)
    assert stored[paths[1]]["note"].decode() == "two\u2028lines\u2029and\x85more"
    assert [row["key"] for row in error_rows(result)] == ["tags.jsonl:4"]


def test_a_csv_header_naming_a_read_column_twice_is_refused(tmp_path):
    """``path,labels,camera,labels``: the first column won, silently."""
    paths = images(tmp_path, 1)
    manifest = tmp_path / "tags.csv"
    manifest.write_text(f"path,labels,camera,exposure,labels\n{paths[0]},cat,1,0.5,dog\n")
    with pytest.raises(ConfigError, match=r"names the column labels 2 times \(columns 2, 5 of"):
        build(config(manifest, tmp_path / "out"))
